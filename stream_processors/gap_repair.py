"""Re-read a range of a source partition to find a session's missing events.

The sequencer calls this when a session has a gap (``SessionSequence.missing_range``):
a record the consumer never handed over (a stream processor that dropped it in a
rebalance) is still in the log, between two known offsets, and is fed back in.
"""

from __future__ import annotations

import logging
import time
import uuid

from confluent_kafka import Consumer, KafkaError, TopicPartition

__all__ = ["LogRangeReader"]

logger = logging.getLogger(__name__)
READ_TIMEOUT_SECONDS = 10.0


class LogRangeReader:
    """Blocking reader of ``topic``; run :meth:`read` in a worker thread. No I/O until the first read."""

    def __init__(self, bootstrap_servers: str, topic: str) -> None:
        self._config = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"turnlog-gap-repair-{uuid.uuid4()}",  # never commits; only assign()
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
        self._topic = topic
        self._consumer: Consumer | None = None

    def read(self, partition: int, first: int, last: int, key: bytes) -> list[tuple[int, bytes]]:
        """``[(offset, value)]`` of the records with ``key`` at offsets ``first..last`` (inclusive)."""
        if last < first:
            return []
        if self._consumer is None:
            self._consumer = Consumer(self._config)
        consumer = self._consumer
        consumer.assign([TopicPartition(self._topic, partition, first)])
        found: list[tuple[int, bytes]] = []
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
                    logger.warning("gap repair read: %s", error.str())
                    continue
                if record.offset() > last:
                    break
                if record.key() == key:
                    found.append((record.offset(), record.value()))
                if record.offset() >= last:
                    break
            else:
                logger.warning("gap repair: reading %s[%d] %d..%d timed out", self._topic, partition, first, last)
        finally:
            consumer.unassign()
        return found

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
