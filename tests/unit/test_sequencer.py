"""The sequencer's batch logic (``Sequencer``), with the broker replaced by
in-memory stand-ins: the log is a list of records, emissions are collected."""

from __future__ import annotations

import contextlib
from typing import Any

from turnlog import metrics
from turnlog.schemas import decode_event, encode_event
from turnlog.settings import TopicNames
from turnlog.stream_processors.sequencer import Sequencer, SourceRecord

from tests.support import EventFactory

TOPICS = TopicNames("t")
CHANGELOG = "t-sequencer-state-changelog"


class _Batch:
    def __init__(self, sent: list[tuple[str, bytes, int, Any]], fail: bool) -> None:
        self._sent = sent
        self._fail = fail
        self._pending: list[tuple[str, bytes, int, Any]] = []

    def send(
        self, topic: str, *, key: bytes | None, value: bytes, partition: int, headers: Any = None, token: Any = None
    ) -> None:
        self._pending.append((topic, value, partition, headers))

    async def delivered(self) -> list[Any]:
        if self._fail:
            raise RuntimeError("broker refused")
        self._sent.extend(self._pending)
        return []


class _Emissions:
    def __init__(self, atomic: bool = False) -> None:
        self.sent: list[tuple[str, bytes, int, Any]] = []
        self.fail = False
        self.atomic = atomic

    def batch(self) -> _Batch:
        return _Batch(self.sent, self.fail)


class _Log:
    """Partition 0 of the events topic, with the group's committed offset."""

    def __init__(self, records: list[SourceRecord], committed: int = 0) -> None:
        self.records = records
        self._committed = committed
        self.reads: list[tuple[int, int]] = []

    def committed(self, partition: int) -> int:
        return self._committed

    def read(self, partition: int, first: int, last: int, key: bytes | None = None) -> list[tuple[int, bytes | None, bytes, Any]]:
        self.reads.append((first, last))
        return [(r.offset, r.key, r.value, r.headers) for r in self.records if first <= r.offset <= last and key in (None, r.key)]


def _log_of(events: list[Any]) -> list[SourceRecord]:
    return [SourceRecord(e.session_id.encode(), encode_event(e), 0, offset) for offset, e in enumerate(events)]


def _sequencer(log: _Log) -> tuple[Sequencer, dict[bytes, Any], _Emissions]:
    states: dict[bytes, Any] = {}
    emissions = _Emissions()
    sequencer = Sequencer(states=states, changelog=CHANGELOG, emissions=emissions, reader=log, topics=TOPICS, max_buffer=8)  # type: ignore[arg-type]
    return sequencer, states, emissions


def _changelog(emissions: _Emissions) -> list[tuple[bytes, int]]:
    import json

    return [(json.loads(value)["next_seq"], partition) for topic, value, partition, _ in emissions.sent if topic == CHANGELOG]


def _emitted_seqs(emissions: _Emissions) -> list[int]:
    return [decode_event(value).seq for topic, value, _, _ in emissions.sent if topic == TOPICS.transcript]


async def test_a_batch_is_emitted_in_order_and_its_state_stored() -> None:
    f = EventFactory()
    records = _log_of([f.started(), f.partial(1, 0, "a"), f.completed(2, 0, "a b")])
    sequencer, states, emissions = _sequencer(_Log(records))
    await sequencer.process(records)
    assert _emitted_seqs(emissions) == [0, 1, 2]
    assert states[f.session_id.encode()]["next_seq"] == 3
    assert _changelog(emissions) == [(3, 0)]  # one state per session per batch, after the emissions


async def test_the_state_is_not_stored_when_the_emissions_are_not_delivered() -> None:
    f = EventFactory()
    records = _log_of([f.started(), f.completed(1, 0, "a")])
    sequencer, states, emissions = _sequencer(_Log(records))
    emissions.fail = True
    with contextlib.suppress(RuntimeError):
        await sequencer.process(records)
    assert states == {} and emissions.sent == []


async def test_an_offset_jump_trips_the_alarm_and_the_skipped_records_are_read_again() -> None:
    f = EventFactory()
    records = _log_of([f.started(), f.partial(1, 0, "a"), f.partial(2, 0, "a b"), f.completed(3, 0, "a b c")])
    log = _Log(records, committed=0)
    sequencer, _, emissions = _sequencer(log)
    before = metrics.OFFSET_JUMPS._value.get()
    await sequencer.process([records[0]])
    await sequencer.process([records[3]])  # the consumer skipped offsets 1 and 2
    assert metrics.OFFSET_JUMPS._value.get() == before + 1
    assert log.reads == [(1, 2)]
    assert _emitted_seqs(emissions) == [0, 1, 2, 3]


async def test_the_first_record_after_assignment_is_checked_against_the_committed_offset() -> None:
    f = EventFactory()
    records = _log_of([f.started(), f.partial(1, 0, "a"), f.completed(2, 0, "a b")])
    log = _Log(records, committed=0)
    sequencer, _, emissions = _sequencer(log)
    before = metrics.OFFSET_JUMPS._value.get()
    await sequencer.process([records[0]])
    sequencer.forget([0])  # revoked, then assigned again: the group committed offset 1
    log._committed = 1
    await sequencer.process([records[1], records[2]])  # starts exactly at the committed offset
    assert metrics.OFFSET_JUMPS._value.get() == before and log.reads == []
    sequencer.forget([0])
    await sequencer.process([records[2]])  # the committed offset (1) was passed: offset 1 is read again
    assert metrics.OFFSET_JUMPS._value.get() == before + 1 and log.reads == [(1, 1)]
    assert _emitted_seqs(emissions) == [0, 1, 2]


async def test_a_session_gap_reads_the_missing_offsets_again_once() -> None:
    f = EventFactory()
    records = _log_of([f.started(), f.completed(1, 0, "a"), f.completed(2, 1, "b")])
    log = _Log(records)
    sequencer, _, emissions = _sequencer(log)
    sequencer._next_offset[0] = 0
    # Offset 1 is delivered after offset 2 only in this batch's order: the continuity
    # check is satisfied by position, the session waits for seq 1 and reads offset 1 again.
    await sequencer.process([records[0]])
    sequencer._next_offset[0] = 3
    await sequencer.process([records[2]])
    assert (1, 1) in log.reads
    assert _emitted_seqs(emissions) == [0, 1, 2]


async def test_a_record_whose_key_is_not_its_session_goes_to_the_dlq() -> None:
    f = EventFactory()
    record = SourceRecord(b"someone-else", encode_event(f.started()), 0, 0)
    sequencer, states, emissions = _sequencer(_Log([record]))
    await sequencer.process([record])
    [(topic, value, _, headers)] = emissions.sent
    assert topic == TOPICS.dlq and value == record.value and states == {}
    assert dict(headers)["turnlog-reason"].startswith(b"invalid: record key")


async def test_a_gap_whose_re_read_failed_is_read_again_by_retry_gaps_without_a_later_record() -> None:
    from turnlog import kafka

    f = EventFactory()
    records = _log_of([f.started(), f.completed(1, 0, "a"), f.completed(2, 1, "b"), f.ended(3, last_turn=1)])
    log = _Log(records)
    failures = [kafka.BrokerUnavailableError("broker away", retriable=True)]
    read = log.read

    def flaky_read(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return read(*args, **kwargs)

    log.read = flaky_read  # type: ignore[method-assign]
    sequencer, states, emissions = _sequencer(log)
    await sequencer.process([records[0]])
    sequencer._next_offset[0] = 4
    await sequencer.process([records[2], records[3]])  # seq 1 never delivered; its re-read fails
    assert _emitted_seqs(emissions) == [0] and sequencer.has_unrepaired_gaps
    await sequencer.retry_gaps()  # no record of the session comes: the retry alone closes the gap
    assert _emitted_seqs(emissions) == [0, 1, 2, 3] and not sequencer.has_unrepaired_gaps
    assert states[f.session_id.encode()]["ended"] is True


async def test_every_transcript_record_carries_its_own_event_type_header() -> None:
    f = EventFactory()
    # seq 1 arrives last: seqs 2 and 3 wait in the gap buffer and are emitted behind it.
    records = _log_of([f.started(), f.completed(2, 1, "b"), f.ended(3, last_turn=1), f.partial(1, 0, "a")])
    sequencer, _, emissions = _sequencer(_Log(records))
    await sequencer.process(records)
    emitted = [
        (decode_event(value).seq, headers) for topic, value, _, headers in emissions.sent if topic == TOPICS.transcript
    ]
    assert emitted == [
        (0, [("turnlog-type", b"session.started")]),
        (1, [("turnlog-type", b"turn.partial")]),
        (2, [("turnlog-type", b"turn.completed")]),  # released from the buffer: its own type, not seq 1's
        (3, [("turnlog-type", b"session.ended")]),
    ]


def _held_gauges() -> tuple[float, float]:
    return metrics.REORDER_BUFFER_EVENTS._value.get(), metrics.GAPS_OPEN._value.get()


async def test_the_reorder_buffer_and_gaps_open_gauges_follow_each_batch_and_revocation() -> None:
    f, g = EventFactory(), EventFactory()
    # Seq 1 of f is nowhere in the log yet: seqs 2 and 3 wait for it; g's seq 2 waits for its seq 1.
    waiting = [f.started(), f.completed(2, 1, "b"), f.completed(3, 2, "c"), g.started(), g.completed(2, 1, "b")]
    records = _log_of(waiting)
    sequencer, _, _ = _sequencer(_Log(records))
    await sequencer.process(records)
    assert _held_gauges() == (3, 2)
    # f's missing seq arrives: its two buffered events are released behind it.
    late = SourceRecord(f.session_id.encode(), encode_event(f.completed(1, 0, "a")), 0, len(records))
    await sequencer.process([late])
    assert _held_gauges() == (1, 1)
    sequencer.forget([0])  # the partition is revoked: its buffers are another worker's now
    assert _held_gauges() == (0, 0)
