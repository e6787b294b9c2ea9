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
