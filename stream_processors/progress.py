"""The sequencer's processed positions, for the resume barrier.

Faust's own committed offset can stall for good when Faust drops a record it
fetched (it never acks it, even after the sequencer re-read it from the log).
So after each batch, once its emissions are acknowledged, the sequencer commits
the next offset it will process, per partition, under a consumer group of its
own, ``<sequencer group>.progress``, which no consumer ever joins. The resume
barrier (``producers/resume.py``) reads those offsets.
"""

from __future__ import annotations

from collections.abc import Mapping

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

    def commit(self, next_offsets: Mapping[int, int]) -> None:
        """Record ``{partition: next offset to process}``."""
        if not next_offsets:
            return
        if self._consumer is None:
            self._consumer = Consumer(self._config)
        # Asynchronous: a commit must never hold up the sequencer (a blocking one
        # has no timeout); a lost one is superseded by the next batch's.
        self._consumer.commit(
            offsets=[TopicPartition(self._topic, p, offset) for p, offset in sorted(next_offsets.items())],
            asynchronous=True,
        )
        self._consumer.poll(0)  # serve the previous commits' results
