"""The sink refuses to start a partition whose stored offset is past the log's end
(the topic was recreated): consuming on would skip every record below it silently."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from turnlog.sinks import service
from turnlog.sinks.exceptions import StoreAheadOfLogError
from turnlog.sinks.offsets import offsets_past_end
from turnlog.sinks.service import SinkService

TOPIC = "t.transcript"


def test_offsets_past_end_names_only_partitions_stored_beyond_their_end() -> None:
    stored = {(TOPIC, 0): 10, (TOPIC, 1): 7, (TOPIC, 2): 3}
    ends = {(TOPIC, 0): 4, (TOPIC, 1): 7}  # partition 2's end unknown: not judged
    assert offsets_past_end(stored, ends) == {(TOPIC, 0): (10, 4)}
    assert offsets_past_end({(TOPIC, 0): 4}, {(TOPIC, 0): 4}) == {}


class _Consumer:
    def __init__(self, ends: list[dict[int, int | None]]) -> None:
        self.ends = ends  # one answer per lookup round; None: the broker does not answer
        self.rounds = 0
        self.assigned: list[TopicPartition] | None = None

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        answer = self.ends[min(self.rounds, len(self.ends) - 1)][tp.partition]
        if tp.partition == max(self.ends[0]):
            self.rounds += 1
        if answer is None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return 0, answer

    def resume(self, partitions: list[TopicPartition]) -> None: ...

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = partitions


def _sink(stored: dict[tuple[str, int], int]) -> Any:
    sink: Any = SinkService.__new__(SinkService)
    sink.consumer_group = "g"
    sink.component = "sink"
    sink.settings = SimpleNamespace(ready_file=None)
    sink._claim = lambda partitions: ({tp: o for tp, o in stored.items() if tp in partitions}, {tp: 1 for tp in partitions})
    return sink


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "END_OFFSET_RETRY_SECONDS", 0.0)


def test_a_stored_offset_past_the_end_stops_the_sink_with_the_remedy() -> None:
    consumer = _Consumer([{0: 3, 1: 50}])
    with pytest.raises(StoreAheadOfLogError) as raised:
        _sink({(TOPIC, 0): 40, (TOPIC, 1): 50})._seek_to_stored(consumer, [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
    assert raised.value.ahead == {(TOPIC, 0): (40, 3)}
    assert "DELETE FROM sink_offsets WHERE consumer_group = 'g'" in str(raised.value)
    assert consumer.assigned is None  # nothing consumed
    assert consumer.rounds == service.END_OFFSET_ATTEMPTS  # asked again before giving up


def test_an_end_that_catches_up_on_a_later_lookup_lets_the_sink_start() -> None:
    consumer = _Consumer([{0: 3}, {0: 40}])  # a broker just restarted, then its end offset
    _sink({(TOPIC, 0): 40})._seek_to_stored(consumer, [TopicPartition(TOPIC, 0)])
    assert consumer.assigned is not None and [tp.offset for tp in consumer.assigned] == [40]


def test_an_unknown_end_is_not_judged() -> None:
    consumer = _Consumer([{0: None}])
    _sink({(TOPIC, 0): 40})._seek_to_stored(consumer, [TopicPartition(TOPIC, 0)])
    assert consumer.assigned is not None and [tp.offset for tp in consumer.assigned] == [40]
