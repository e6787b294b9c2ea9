"""Which partition a session lives on: Kafka's murmur2, as the Java client computes it."""

from __future__ import annotations

from aiokafka.partitioner import murmur2

__all__ = ["partition_for"]


def partition_for(session_id: str, partitions: int) -> int:
    """``toPositive(murmur2(utf8(session_id))) % partitions`` (Kafka's DefaultPartitioner).

    Agrees with confluent-kafka's ``murmur2_random`` partitioner and with Faust
    (aiokafka) for non-empty keys; an integration test holds them together.
    """
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    return (murmur2(session_id.encode("utf-8")) & 0x7FFFFFFF) % partitions
