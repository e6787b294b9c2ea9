"""The sink's assignment callback leaves no partition paused: librdkafka keeps a partition's pause across
assignments, so a partition paused while the sink waited out a store outage (``_wait_in_group``) and
revoked before the sink resumed it would otherwise come back paused and never be read again
(tests/integration/test_sink_rebalance.py shows it on the real broker)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from turnlog.settings import TurnlogSettings
from turnlog.sinks.service import SinkService

TOPIC = "t.transcript"


class PauseKeepingConsumer:
    """A consumer as librdkafka behaves: ``assign`` neither pauses nor resumes; a partition
    stays paused, assigned or not, until ``resume``. Records the order of the calls."""

    def __init__(self) -> None:
        self.assigned: list[TopicPartition] = []
        self.paused: set[tuple[str, int]] = set()
        self.calls: list[str] = []

    def assignment(self) -> list[TopicPartition]:
        return list(self.assigned)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.calls.append("pause")
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.calls.append("resume")
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.calls.append("assign")
        self.assigned = list(partitions)

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        return 0, 1_000_000  # every stored offset is within the log


def _sink() -> Any:
    sink = SinkService(TurnlogSettings(), store=None, write=lambda *a: None)  # type: ignore[arg-type]
    sink._claim = lambda partitions: ({tp: 5 for tp in partitions}, {tp: 2 for tp in partitions})
    return sink


def test_a_partition_paused_under_an_earlier_assignment_is_resumed_when_assigned_again() -> None:
    sink, consumer = _sink(), PauseKeepingConsumer()
    sink._seek_to_stored(consumer, [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
    consumer.pause(consumer.assignment())  # the store went down: the sink waits with its partitions paused
    sink._revoked(consumer, consumer.assignment())  # a rebalance before the store came back
    consumer.assign([])

    sink._seek_to_stored(consumer, [TopicPartition(TOPIC, 1)])

    assert consumer.paused == {(TOPIC, 0)}  # partition 0 is no longer this sink's: its pause is not its concern
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [(1, 5)]
    # Resumed before the assign: a resume after it could outdate the assign's start offsets (librdkafka).
    assert consumer.calls[-2:] == ["resume", "assign"]
