"""Read ranges of a source partition again, for the sequencer's two tripwires.

- offset continuity: the first record of a partition must follow the group's
  committed offset, and each later one the previous one; a jump (faust-streaming
  dropped fetched records at recovery completion before ``recovery.py``) is an
  alarm, and the skipped range is read again;
- session gaps: a missing seq, if it was ever written, sits between the offsets
  ``SessionSequence.missing_range`` names.
"""

from __future__ import annotations

import logging
import time
import uuid

from confluent_kafka import Consumer, KafkaError, TopicPartition

__all__ = ["LogRangeReader", "LogRecord"]

logger = logging.getLogger(__name__)
READ_TIMEOUT_SECONDS = 30.0

LogRecord = tuple[int, bytes | None, bytes]  # (offset, key, value)


class LogRangeReader:
    """Blocking reader of ``topic``; run its methods in a worker thread. No I/O until first use."""

    def __init__(self, bootstrap_servers: str, topic: str, group_id: str) -> None:
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._group_id = group_id
        self._reader: Consumer | None = None
        self._offsets: Consumer | None = None

    def _offsets_consumer(self) -> Consumer:
        """A consumer of the group, for offset lookups only (it never subscribes)."""
        if self._offsets is None:
            self._offsets = Consumer(
                {"bootstrap.servers": self._bootstrap, "group.id": self._group_id, "enable.auto.commit": False}
            )
        return self._offsets

    def committed(self, partition: int) -> int:
        """The group's committed offset of ``partition`` (0 when it has none)."""
        [tp] = self._offsets_consumer().committed([TopicPartition(self._topic, partition)], timeout=10)
        return max(tp.offset, 0)

    def end_offset(self, partition: int) -> int:
        """The partition's high watermark: the offset the next record written will get."""
        return self._offsets_consumer().get_watermark_offsets(TopicPartition(self._topic, partition), timeout=10)[1]

    def read(self, partition: int, first: int, last: int, key: bytes | None = None) -> list[LogRecord]:
        """The records at offsets ``first..last`` (inclusive), only those with ``key`` if given."""
        if last < first:
            return []
        if self._reader is None:
            self._reader = Consumer(
                {
                    "bootstrap.servers": self._bootstrap,
                    "group.id": f"turnlog-gap-repair-{uuid.uuid4()}",  # never commits; assign() only
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                }
            )
        consumer = self._reader
        consumer.assign([TopicPartition(self._topic, partition, first)])
        found: list[LogRecord] = []
        deadline = time.monotonic() + READ_TIMEOUT_SECONDS
        try:
            while time.monotonic() < deadline:
                record = consumer.poll(0.5)
                if record is None:
                    continue
                error = record.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        break
                    logger.warning("re-read of %s[%d]: %s", self._topic, partition, error.str())
                    continue
                if record.offset() > last:
                    break
                if key is None or record.key() == key:
                    found.append((record.offset(), record.key(), record.value()))
                if record.offset() >= last:
                    break
            else:
                logger.error("re-read of %s[%d] %d..%d timed out", self._topic, partition, first, last)
        finally:
            consumer.unassign()
        return found

    def close(self) -> None:
        for consumer in (self._reader, self._offsets):
            if consumer is not None:
                consumer.close()
        self._reader = self._offsets = None
