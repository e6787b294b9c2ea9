"""Read a partition with confluent-kafka where aiokafka cannot unpack it.

aiokafka decodes every header name as UTF-8 while it unpacks a fetched batch;
one record whose header name is not UTF-8 (Kafka does not validate them) makes
the whole fetch of its partition fail, every time, before any record reaches
Faust (``stream_processors/fetching.py`` has the details). confluent-kafka reads
such a record: only its headers are unreadable (``turnlog.kafka.record_headers``).

:class:`PartitionScanner` reads a partition from an offset with confluent-kafka
and returns the records as aiokafka's ``ConsumerRecord`` (what Faust's consumer
hands on), up to and including the first record whose headers cannot be read,
which carries :class:`~turnlog.kafka.record_headers.UnreadableHeaders`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiokafka.structs import ConsumerRecord
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, TopicPartition

from turnlog import kafka
from turnlog.kafka.record_headers import UnreadableHeaders, read_headers
from turnlog.settings import TurnlogSettings

__all__ = ["PartitionScanner", "consumer_record", "SCAN_TIMEOUT_SECONDS"]

#: How long one scan may wait for the broker before it gives up (seconds).
SCAN_TIMEOUT_SECONDS = 30.0
#: aiokafka's ``timestamp_type`` values.
_CREATE_TIME, _LOG_APPEND_TIME = 0, 1


def consumer_record(message: Any) -> ConsumerRecord[bytes, bytes]:
    """A confluent-kafka ``Message`` (without an error) as aiokafka's ``ConsumerRecord``: the
    same topic, partition, offset, timestamp, key, value and headers (a tuple of
    ``(name, value)``, or :class:`UnreadableHeaders` when they cannot be read)."""
    key, value = message.key(), message.value()
    headers = read_headers(message)
    timestamp_type, timestamp = message.timestamp()
    return ConsumerRecord(
        topic=message.topic(),
        partition=message.partition(),
        offset=message.offset(),
        timestamp=timestamp,
        timestamp_type=_LOG_APPEND_TIME if timestamp_type == TIMESTAMP_LOG_APPEND_TIME else _CREATE_TIME,
        key=key,
        value=value,
        checksum=None,
        serialized_key_size=len(key) if key is not None else -1,
        serialized_value_size=len(value) if value is not None else -1,
        headers=headers if isinstance(headers, UnreadableHeaders) else tuple(headers or ()),
    )


def _size(record: ConsumerRecord[bytes, bytes]) -> int:
    """Bytes a record holds: key, value, header names and values."""
    headers = sum(len(name.encode("utf-8")) + len(value or b"") for name, value in record.headers)
    return max(record.serialized_key_size, 0) + max(record.serialized_value_size, 0) + headers


class PartitionScanner:
    """Reads partitions with confluent-kafka, from the connection settings of every turnlog
    client. Blocking: run :meth:`scan` in a worker thread. Each scan has a consumer of its
    own (scans are rare: only where aiokafka failed)."""

    def __init__(self, settings: TurnlogSettings) -> None:
        self._settings = settings

    def scan(
        self, topic: str, partition: int, first: int, *, max_records: int, max_bytes: int, read_committed: bool
    ) -> list[ConsumerRecord[bytes, bytes]]:
        """The records of ``topic[partition]`` from offset ``first``, in order, as aiokafka's
        consumer (``read_committed``: its isolation level) would deliver them. It stops after
        the first record whose headers cannot be read (the last one returned, its headers an
        :class:`UnreadableHeaders`), after ``max_records`` records or ``max_bytes`` bytes of
        them (keys, values, headers), at the partition's end, or before an error the client
        does not retry (a corrupt batch). ``[]``: no record could be read at ``first``.

        Raises:
            BrokerError: the broker did not answer within ``SCAN_TIMEOUT_SECONDS`` and nothing was read.
        """
        consumer = kafka.consumer(
            self._settings,
            group_id=f"turnlog-unreadable-scan-{uuid.uuid4()}",  # never commits; assign() only
            **{
                "enable.partition.eof": True,
                "check.crcs": True,  # a corrupt batch stops the scan: it is not one record's failure
                "isolation.level": "read_committed" if read_committed else "read_uncommitted",
            },
        )
        records: list[ConsumerRecord[bytes, bytes]] = []
        try:
            with kafka.broker_errors(f"reading {topic}[{partition}] from {first}"):
                consumer.assign([TopicPartition(topic, partition, first)])
                ended = _read(consumer, records, max_records=max_records, max_bytes=max_bytes,
                              deadline=time.monotonic() + SCAN_TIMEOUT_SECONDS)
        finally:
            consumer.close()
        if not ended and not records:  # what was read is read: the next scan goes on from there
            raise kafka.BrokerUnavailableError(
                f"reading {topic}[{partition}] from {first} timed out after {SCAN_TIMEOUT_SECONDS:.0f} s",
                retriable=True,
            )
        return records


def _read(
    consumer: Any, records: list[ConsumerRecord[bytes, bytes]], *, max_records: int, max_bytes: int, deadline: float
) -> bool:
    """Append to ``records`` what ``consumer`` reads, up to :meth:`PartitionScanner.scan`'s stops.
    False: ``deadline`` (``time.monotonic()``) passed first."""
    size = 0
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF or not kafka.to_broker_error(error).retriable:
                return True  # the end, or a batch the client cannot read (corrupt): not one record's failure
            continue  # the broker away for a moment: the client tries again
        record = consumer_record(message)
        records.append(record)
        size += _size(record)
        if isinstance(record.headers, UnreadableHeaders) or len(records) >= max_records or size >= max_bytes:
            return True
    return False
