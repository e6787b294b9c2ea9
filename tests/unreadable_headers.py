"""Records whose header name is not UTF-8, as any writer of a topic can send them (Kafka does not
validate header names): built with aiokafka's pure-Python record batch builder (importable
whether or not its C extension is in use), then a placeholder name is replaced by bytes that are
not UTF-8 and the batch's CRC is computed again."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.record.util import calc_crc32c

#: The header name the records get: 4 bytes that are not UTF-8.
NOT_UTF8_NAME = b"\xff\xfe\xfd\xfc"
_PLACEHOLDER = b"\x01\x02\x03\x04"  # a valid name of the same length, replaced after the build
_CRC_AT, _CRC_FROM = 17, 21  # where a v2 batch keeps its CRC, and where the bytes it covers start


class _UnreadableNameBuilder(_DefaultRecordBatchBuilderPy):
    """aiokafka's pure-Python builder whose records with the placeholder header get the non-UTF-8 name."""

    def build(self) -> bytearray:
        batch = bytearray(super().build())
        return _with_unreadable_names(batch)


def _with_unreadable_names(batch: bytearray) -> bytearray:
    batch = bytearray(batch.replace(_PLACEHOLDER, NOT_UTF8_NAME))
    struct.pack_into(">I", batch, _CRC_AT, calc_crc32c(bytes(batch[_CRC_FROM:])))
    return batch


def _builder() -> _UnreadableNameBuilder:
    return _UnreadableNameBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1, base_sequence=-1,
        batch_size=1 << 20,
    )


def unreadable_header() -> tuple[str, bytes]:
    """The header to give a record (in :func:`record_batch`) whose name must not be UTF-8."""
    return (_PLACEHOLDER.decode(), b"x")


def record_batch(base_offset: int, records: Sequence[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]) -> bytes:
    """One v2 record batch (as a broker returns it) of ``records`` (key, value, headers) at offsets
    ``base_offset``...; a record with :func:`unreadable_header` has a header name that is not UTF-8."""
    builder = _builder()
    for delta, (key, value, headers) in enumerate(records):
        builder.append(delta, timestamp=1_700_000_000_000, key=key, value=value, headers=headers)
    batch = builder.build()
    struct.pack_into(">q", batch, 0, base_offset)  # the base offset is outside the CRC
    return bytes(batch)


async def send_unreadable(bootstrap_servers: str, topic: str, partition: int, key: bytes, value: bytes) -> int:
    """Write one record whose header name is not UTF-8 to ``topic[partition]``; its offset."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all")
    await producer.start()
    try:
        batch = producer.create_batch()
        batch._builder = _builder()  # the producer's own batch, built by the pure-Python builder
        assert batch.append(key=key, value=value, timestamp=None, headers=[unreadable_header()]) is not None
        batch.close()
        metadata = await (await producer.send_batch(batch, topic, partition=partition))
        return int(metadata.offset)
    finally:
        await producer.stop()
