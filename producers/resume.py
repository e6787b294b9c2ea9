"""The resume barrier (DESIGN.md, "Events"): before a new process continues a
session, every event its predecessor got acknowledged must be applied.

1. read the end offset E of the session's partition of ``<prefix>.events``;
2. wait until the sequencer's consumer group has committed offset >= E there
   (Faust flushes its producer before committing, so everything the sequencer
   emitted for those events is in ``<prefix>.transcript``);
3. read the end offset T of the same partition of ``<prefix>.transcript``;
4. wait until the sink's stored offset (``sink_offsets``, same transaction as
   the rows) is >= T;
5. read the session's position from the store.
"""

from __future__ import annotations

import logging
import time
import uuid

from confluent_kafka import Consumer, KafkaException, TopicPartition

from turnlog.producers.exceptions import ResumeBarrierTimeout
from turnlog.producers.partitioning import partition_for
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SessionPosition, SqlStore, StoreUnavailableError
from turnlog.sinks.errors import store_errors

__all__ = ["ResumeBarrier"]

logger = logging.getLogger(__name__)
POLL_INTERVAL_SECONDS = 0.1


class ResumeBarrier:
    """Blocking barrier; :meth:`wait` is meant to run in a worker thread."""

    def __init__(self, settings: TurnlogSettings, store: SqlStore) -> None:
        self._settings = settings
        self._store = store

    def wait(self, session_id: str, timeout: float) -> tuple[int, SessionPosition] | None:
        """Pass the barrier for ``session_id``, claim its next epoch, and return
        ``(new epoch, stored position)``; None if the store does not know the session.

        Raises:
            ResumeBarrierTimeout: the sequencer or the sink did not catch up, or
                the store did not answer, within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        topics = self._settings.topics
        partition = partition_for(session_id, self._settings.partitions)
        # A throwaway group id for watermarks; the sequencer's id only to read its commits.
        watermarks = Consumer(self._consumer_config(f"turnlog-resume-{uuid.uuid4()}"))
        sequencer = Consumer(self._consumer_config(self._settings.sequencer_group))
        try:
            events_tp = TopicPartition(topics.events, partition)
            events_end = watermarks.get_watermark_offsets(events_tp, timeout=_left(deadline), cached=False)[1]
            self._until(
                deadline,
                lambda: _committed(sequencer, events_tp, deadline) >= events_end,
                f"the sequencer ({self._settings.sequencer_group}) to consume {topics.events}[{partition}] "
                f"up to offset {events_end}",
            )
            transcript_tp = TopicPartition(topics.transcript, partition)
            transcript_end = watermarks.get_watermark_offsets(transcript_tp, timeout=_left(deadline), cached=False)[1]
        except KafkaException as e:
            raise ResumeBarrierTimeout(f"resume barrier for {session_id}: broker error: {e}") from e
        finally:
            watermarks.close()
            sequencer.close()
        self._until(
            deadline,
            lambda: self._sink_offset(topics.transcript, partition) >= transcript_end,
            f"the sink ({self._settings.sink_group}) to store {topics.transcript}[{partition}] "
            f"up to offset {transcript_end}",
        )
        while True:
            try:
                with store_errors(), self._store.engine.begin() as conn:
                    return self._store.claim_epoch(conn, session_id)
            except StoreUnavailableError as e:
                if time.monotonic() >= deadline:
                    raise ResumeBarrierTimeout(f"resume barrier: the store did not answer: {e}") from e
                time.sleep(POLL_INTERVAL_SECONDS)

    def _consumer_config(self, group_id: str) -> dict[str, object]:
        return {
            "bootstrap.servers": self._settings.bootstrap_servers,
            "group.id": group_id,
            "enable.auto.commit": False,
        }

    def _sink_offset(self, topic: str, partition: int) -> int:
        try:
            with store_errors(), self._store.engine.connect() as conn:
                stored = self._store.stored_offsets(conn, self._settings.sink_group, [(topic, partition)])
        except StoreUnavailableError as e:
            logger.warning("resume barrier: store unavailable, polling on: %s", e)
            return -1
        return stored.get((topic, partition), 0)

    @staticmethod
    def _until(deadline: float, condition: object, what: str) -> None:
        assert callable(condition)
        while not condition():
            if time.monotonic() >= deadline:
                raise ResumeBarrierTimeout(f"resume barrier: timed out waiting for {what}")
            time.sleep(POLL_INTERVAL_SECONDS)


def _left(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())


def _committed(consumer: Consumer, tp: TopicPartition, deadline: float) -> int:
    [committed] = consumer.committed([TopicPartition(tp.topic, tp.partition)], timeout=min(5.0, _left(deadline)))
    return committed.offset if committed.offset >= 0 else 0
