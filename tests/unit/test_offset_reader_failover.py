"""OffsetReader through a leader's death: a partition missing from the client's metadata for a
while (librdkafka's local ``_UNKNOWN_PARTITION``) is looked up again, not reported as a
topic that does not exist (``turnlog/kafka/offsets.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from turnlog.kafka import OffsetReader, UnknownTopicError
from turnlog.kafka import offsets as offsets_module
from turnlog.settings import TurnlogSettings


class _MetadataCatchingUp:
    """A lookup consumer whose metadata lacks the partition for the first ``misses`` lookups."""

    def __init__(self, misses: int) -> None:
        self.misses = misses
        self.metadata_refreshes = 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        if self.misses:
            self.misses -= 1
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        return 3, 42

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.metadata_refreshes += 1


def _reader_with(consumer: _MetadataCatchingUp, monkeypatch: pytest.MonkeyPatch) -> OffsetReader:
    monkeypatch.setattr(offsets_module.OffsetReader, "_consumer", lambda self, group_id: consumer)
    return OffsetReader(TurnlogSettings())


def test_a_partition_the_metadata_lacks_for_a_while_is_looked_up_again(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _MetadataCatchingUp(misses=2)
    reader = _reader_with(consumer, monkeypatch)
    assert reader.end_offsets("t", [1]) == {1: 42}
    assert consumer.metadata_refreshes == 2  # each miss asked for the topic's metadata again


def test_a_partition_that_stays_unknown_is_reported_once_the_lookup_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offsets_module, "LOOKUP_ATTEMPTS", 2)
    reader = _reader_with(_MetadataCatchingUp(misses=10), monkeypatch)
    with pytest.raises(UnknownTopicError) as raised:
        reader.end_offsets("t", [1])
    assert raised.value.retriable  # the caller's own deadline may try again


class _BrokerNotServingYet:
    """A consumer whose fetches give nothing for the first ``stalls`` reads of a partition (a
    broker just restarted, still recovering its logs), then the records up to the high watermark."""

    def __init__(self, stalls: int, high: int) -> None:
        self.stalls, self.high, self.position_at = stalls, high, -1001
        self.reads = 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        return 0, self.high

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.reads += 1
        self.position_at = -1001

    def unassign(self) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        if self.reads <= self.stalls:
            return []
        self.position_at = self.high
        return [_Record(self.high - 1)]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(partitions[0].topic, partitions[0].partition, self.position_at)]

    def list_topics(self, topic: str, timeout: float) -> Any:
        pass


class _Record:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self._offset

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 1


def test_a_last_record_not_served_in_time_is_looked_up_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in chaos (seed 16180): right after a broker restart the changelog read made no
    progress in the request's time, and a non-retriable error crashed the sequencer's restore."""
    monkeypatch.setattr(offsets_module, "REQUEST_TIMEOUT_SECONDS", 0.2)
    consumer = _BrokerNotServingYet(stalls=2, high=376)
    reader = _reader_with(consumer, monkeypatch)  # type: ignore[arg-type]
    assert reader.record_ends("t", [1]) == {1: 376}
    assert consumer.reads == 3  # two reads timed out, the third found the last record
