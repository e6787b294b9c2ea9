"""Read ranges of a source partition again, for the sequencer's two tripwires.

- offset continuity: the first record of a partition must follow the group's
  committed offset, and each later one the previous one; a jump (faust-streaming
  dropped fetched records at recovery completion before ``recovery.py``) is an
  alarm, and the skipped range is read again;
- session gaps: a missing seq, if it was ever written, sits between the offsets
  ``SessionSequence.missing_range`` names.

It also reads back the events a session's reorder buffer holds by position only
(``sequencing.Buffered``) when they are released or rejected: :func:`offset_runs`
groups their offsets into ranges worth reading in one pass.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import cast

from confluent_kafka import Consumer, KafkaError, TopicPartition

from turnlog import kafka
from turnlog.kafka.record_headers import UnreadableHeaders, read_headers
from turnlog.settings import TurnlogSettings

__all__ = ["LogRangeReader", "LogRecord", "offset_runs"]

logger = logging.getLogger(__name__)
READ_TIMEOUT_SECONDS = 30.0

#: (offset, key, value, headers); headers: UnreadableHeaders when they cannot be read (a name that is not UTF-8)
LogRecord = tuple[int, bytes | None, bytes, list[tuple[str, bytes]] | UnreadableHeaders | None]


def offset_runs(offsets: list[int], max_step: int) -> list[tuple[int, int]]:
    """``(first, last)`` ranges (inclusive, ascending) that cover the sorted ``offsets``; two
    offsets share a range when at most ``max_step`` apart, so a range never reads more than
    ``max_step - 1`` unwanted records between two wanted ones (``[]`` for no offsets)."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and offset - runs[-1][1] <= max_step:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


class LogRangeReader:
    """Blocking reader of ``topic``; run its methods in a worker thread. No I/O until first use.

    Raises (every method):
        BrokerError: the broker did not answer, after ``turnlog.kafka``'s retries.
    """

    def __init__(self, settings: TurnlogSettings, topic: str, group_id: str) -> None:
        self._settings = settings
        self._topic = topic
        self._group_id = group_id
        self._reader: Consumer | None = None
        self._offsets = kafka.OffsetReader(settings)

    def committed(self, partition: int) -> int:
        """The group's committed offset of ``partition`` (0 when it has none)."""
        return self._offsets.committed(self._group_id, self._topic, [partition])[partition] or 0

    def end_offset(self, partition: int) -> int:
        """The partition's high watermark: the offset the next record written will get."""
        return self._offsets.end_offsets(self._topic, [partition])[partition]

    def read(self, partition: int, first: int, last: int, key: bytes | None = None) -> list[LogRecord]:
        """The records at offsets ``first..last`` (inclusive), only those with ``key`` if given.
        A record whose headers cannot be read is returned with :class:`UnreadableHeaders`.

        Raises:
            BrokerUnavailableError: the range was not read to its end within ``READ_TIMEOUT_SECONDS``.
        """
        if last < first:
            return []
        if self._reader is None:
            self._reader = kafka.consumer(
                self._settings,
                group_id=f"turnlog-gap-repair-{uuid.uuid4()}",  # never commits; assign() only
                **{"enable.partition.eof": True},
            )
        consumer = self._reader
        found: list[LogRecord] = []
        deadline = time.monotonic() + READ_TIMEOUT_SECONDS
        with kafka.broker_errors(f"reading {self._topic}[{partition}] {first}..{last} again"):
            consumer.assign([TopicPartition(self._topic, partition, first)])
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
                    offset = cast(int, record.offset())  # every record without an error has its offset
                    if offset > last:
                        break
                    if key is None or record.key() == key:
                        found.append((offset, record.key(), cast(bytes, record.value()), read_headers(record)))
                    if offset >= last:
                        break
                else:
                    # A partial answer must not pass for the whole range: the caller retries later.
                    raise kafka.BrokerUnavailableError(
                        f"re-read of {self._topic}[{partition}] {first}..{last} timed out after"
                        f" {READ_TIMEOUT_SECONDS:.0f} s",
                        retriable=True,
                    )
            finally:
                consumer.unassign()
        return found

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self._reader = None
        self._offsets.close()
