"""The sequencer's processed positions, for the resume barrier.

Faust's own committed offset can stall for good when Faust drops a record it
fetched (it never acks it, even after the sequencer re-read it from the log).
So after each batch, once its emissions are acknowledged, the sequencer commits
the next offset it will process, per partition, under a consumer group of its
own, ``<sequencer group>.progress``, which no consumer ever joins. The resume
barrier (``producers/resume.py``) reads those offsets.

Those commits are asynchronous, so one can be lost (the broker killed, the
coordinator moving), and a replacement sequencer whose partitions get no new
record commits nothing. Either would hold the barrier for good. So the
sequencer also calls :meth:`ProgressCommitter.catch_up` on a timer: for each
partition it owns, progress moves up to what it has processed, or to Faust's
committed offset where it has processed nothing yet. Progress only moves
forward: a stale value is never committed over a newer one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, TopicPartition

__all__ = ["progress_group", "ProgressCommitter"]


def progress_group(sequencer_group: str) -> str:
    """The group under which the sequencer records what it has processed."""
    return f"{sequencer_group}.progress"


class ProgressCommitter:
    """Commits processed positions, without waiting for the broker. No I/O until the first commit."""

    def __init__(self, bootstrap_servers: str, topic: str, sequencer_group: str) -> None:
        self._config = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": progress_group(sequencer_group),
            "enable.auto.commit": False,
        }
        self._topic = topic
        self._consumer: Consumer | None = None

    def stored(self, partitions: Iterable[int]) -> dict[int, int]:
        """``{partition: recorded next offset}`` (-1 where none is recorded). Blocking (run it in a thread).

        Raises:
            KafkaException: the broker did not answer (10 s).
        """
        consumer = self._client()
        tps = [TopicPartition(self._topic, p) for p in sorted(partitions)]
        if not tps:
            return {}
        return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}

    def catch_up(self, candidates: Mapping[int, int]) -> dict[int, int]:
        """Commit each ``{partition: next offset}`` that is past the recorded one; returns what it committed.
        Blocking (run it in a thread).

        Raises:
            KafkaException: the broker did not answer (10 s).
        """
        recorded = self.stored(candidates)
        behind = {p: offset for p, offset in candidates.items() if offset > recorded.get(p, -1)}
        self.commit(behind)
        return behind

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self._config)
        return self._consumer

    def commit(self, next_offsets: Mapping[int, int]) -> None:
        """Record ``{partition: next offset to process}``."""
        if not next_offsets:
            return
        consumer = self._client()
        # Asynchronous: a commit must never hold up the sequencer (a blocking one
        # has no timeout); a lost one is superseded by the next batch's.
        consumer.commit(
            offsets=[TopicPartition(self._topic, p, offset) for p, offset in sorted(next_offsets.items())],
            asynchronous=True,
        )
        consumer.poll(0)  # serve the previous commits' results
