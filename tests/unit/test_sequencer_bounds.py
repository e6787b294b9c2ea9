"""The sequencer's bounds in bytes, with the broker replaced by in-memory stand-ins: buffered
events kept as log positions and read back when the gap fills, the state record's budget,
records too large to send, records the broker refuses, and per-record failures that must
never escape ``Sequencer.process``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from turnlog import kafka, metrics
from turnlog.dlq import reason_class
from turnlog.schemas import decode_event, encode_event
from turnlog.settings import TopicNames
from turnlog.stream_processors import sequencer as sequencer_module
from turnlog.stream_processors.emitter import MAX_RECORD_BYTES, EmissionFailed
from turnlog.stream_processors.sequencer import MAX_STATE_BYTES, Sequencer, SourceRecord
from turnlog.stream_processors.sequencing import Buffered, SessionSequence

from tests.support import EventFactory

TOPICS = TopicNames("t")
CHANGELOG = "t-sequencer-state-changelog"
BIG_TEXT = "x" * 200_000


class Sent:
    """A record the stand-in broker took."""

    def __init__(self, topic: str, key: bytes | None, value: bytes | None, headers: Any) -> None:
        self.topic, self.key, self.value, self.headers = topic, key, value, dict(headers or [])

    @property
    def reason(self) -> str:
        return self.headers["turnlog-reason"].decode()


class Batch:
    """A stand-in ``EmissionBatch``: records refused by ``broker.refuses`` are reported by
    token, and, like the broker, every other record sent with them in this batch too."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.pending: list[tuple[Sent, Any]] = []

    def send(self, topic: str, *, key: bytes | None, value: bytes | None, partition: int, headers: Any = None,
             token: Any = None) -> None:
        self.pending.append((Sent(topic, key, value, headers), token))

    async def delivered(self) -> list[tuple[Any, kafka.BrokerError]]:
        if any(self.broker.refuses(record) for record, _ in self.pending):
            refused = [(token, kafka.RecordRefusedError("too large", code=10)) for _, token in self.pending]
            if any(token is None for token, _ in refused):
                raise AssertionError("a refused record was sent without a token")
            self.broker.refused_batches += 1
            return refused
        self.broker.sent.extend(record for record, _ in self.pending)
        return []


class Broker:
    """The stand-in broker. ``atomic``: its batches are transactions (``PartitionTransactions``),
    the states sent with the emissions; otherwise the states follow them in a batch of their own."""

    def __init__(self, atomic: bool = False) -> None:
        self.atomic = atomic
        self.sent: list[Sent] = []
        self.refuses: Callable[[Sent], bool] = lambda record: False
        self.refused_batches = 0

    def batch(self) -> Batch:
        return Batch(self)

    def on(self, topic: str) -> list[Sent]:
        return [record for record in self.sent if record.topic == topic]

    def seqs(self, key: bytes | None = None) -> list[int]:
        return [decode_event(r.value).seq for r in self.on(TOPICS.transcript) if key in (None, r.key)]

    def states(self) -> list[bytes]:
        return [record.value for record in self.on(CHANGELOG) if record.value is not None]


class Log:
    """Partition 0 of the events topic: what the sequencer reads again."""

    def __init__(self) -> None:
        self.records: list[SourceRecord] = []
        self.reads: list[tuple[int, int]] = []
        self.failure: kafka.BrokerError | None = None

    def append(self, *events: Any, key: bytes | None = None) -> list[SourceRecord]:
        added = []
        for event in events:
            value = event if isinstance(event, bytes) else encode_event(event)
            record_key = key if key is not None else event.session_id.encode()
            added.append(SourceRecord(record_key, value, 0, len(self.records)))
            self.records.append(added[-1])
        return added

    def committed(self, partition: int) -> int:
        return 0

    def read(self, partition: int, first: int, last: int, key: bytes | None = None) -> list[Any]:
        if self.failure is not None:
            raise self.failure
        self.reads.append((first, last))
        return [(r.offset, r.key, r.value, r.headers) for r in self.records
                if first <= r.offset <= last and key in (None, r.key)]


def make(log: Log, *, atomic: bool = False, **bounds: Any) -> tuple[Sequencer, dict[bytes, Any], Broker]:
    states: dict[bytes, Any] = {}
    broker = Broker(atomic)
    sequencer = Sequencer(states=states, changelog=CHANGELOG, emissions=broker, reader=log,  # type: ignore[arg-type]
                          topics=TOPICS, max_buffer=bounds.pop("max_buffer", 1024), **bounds)
    return sequencer, states, broker


async def feed(sequencer: Sequencer, records: list[SourceRecord]) -> None:
    """One batch per record, as a slow trickle arrives (each state goes through the changelog)."""
    for record in records:
        await sequencer.process([record])


async def test_buffered_events_are_stored_as_positions_and_read_again_when_the_gap_fills() -> None:
    f, healthy = EventFactory(), EventFactory()
    others = [EventFactory() for _ in range(40)]
    log = Log()
    sequencer, states, broker = make(log)
    # seq 1 is late; ten ~200 KB partials wait behind it, 80 records of other sessions among them.
    records = log.append(f.started(), *[f.partial(seq, 0, BIG_TEXT + str(seq)) for seq in range(2, 7)])
    records += log.append(healthy.started(), healthy.completed(1, 0, "fine"), healthy.ended(2, last_turn=0))
    records += log.append(*[e for other in others for e in (other.started(), other.ended(1))])
    records += log.append(*[f.partial(seq, 0, BIG_TEXT + str(seq)) for seq in range(7, 12)])
    await feed(sequencer, records)
    key = f.session_id.encode()
    assert broker.seqs(key) == [0] and broker.seqs(healthy.session_id.encode()) == [0, 1, 2]
    assert len(broker.seqs()) == 1 + 3 + 80
    # No state record ever held more than the positions.
    assert max(len(state) for state in broker.states()) < 2_000
    assert len(states[key]["buffered"]) == 10 and states[key]["buffer"] == {}
    partials = [r for r in records if r.key == key][1:]
    log.reads.clear()
    await feed(sequencer, log.append(f.partial(1, 0, "x"), f.ended(12, last_turn=0)))
    assert broker.seqs(key) == list(range(13))  # in seq order, each with its own bytes and type
    released = [r for r in broker.on(TOPICS.transcript) if r.key == key][2:12]
    assert [r.value for r in released] == [r.value for r in partials]
    assert {r.headers["turnlog-type"] for r in released} == {b"turn.partial"}
    # The held offsets were read in two ranges, not one over the other sessions' 80 records.
    assert log.reads == [(partials[0].offset, partials[4].offset), (partials[5].offset, partials[9].offset)]
    assert states[key]["ended"] is True and states[key]["buffered"] == {}


async def test_events_released_in_the_batch_that_buffered_them_are_not_read_again() -> None:
    f = EventFactory()
    log = Log()
    sequencer, _, broker = make(log)
    records = log.append(f.started(), f.completed(2, 1, "b"), f.completed(3, 2, "c"), f.completed(1, 0, "a"))
    await sequencer.process(records)
    assert broker.seqs() == [0, 1, 2, 3]
    assert log.reads == []  # the gap closed within the batch: nothing is read again


async def test_a_buffered_event_gone_from_the_log_goes_to_the_dlq_as_lost_and_the_rest_is_emitted() -> None:
    f = EventFactory()
    log = Log()
    sequencer, _, broker = make(log)
    routed = metrics.DLQ_ROUTED.labels("sequencer", "lost")
    before = routed._value.get()
    await feed(sequencer, log.append(f.started(), f.completed(2, 1, "b"), f.completed(3, 2, "c")))
    log.records[1] = SourceRecord(log.records[1].key, b"", 0, 1)  # offset 1 deleted by retention (or rewritten)
    await feed(sequencer, log.append(f.completed(1, 0, "a")))
    assert broker.seqs() == [0, 1, 3]
    [lost] = broker.on(TOPICS.dlq)
    assert lost.value == b"" and lost.reason.startswith("lost: buffered seq 2 is not in t.events[0]@1")
    assert lost.headers["turnlog-source-offset"] == b"1"
    assert routed._value.get() == before + 1  # its own class of the bounded label set (turnlog.dlq.REASON_CLASSES)
    assert reason_class(lost.reason) == "lost"


async def test_a_legacy_state_with_raw_buffered_bytes_loads_and_releases_them_without_a_read() -> None:
    f = EventFactory()
    log = Log()
    sequencer, states, broker = make(log)
    held = encode_event(f.completed(2, 1, "b"))
    key = f.session_id.encode()
    # A changelog record written before positions (the bytes inline, as text).
    states[key] = {"epoch": 0, "next_seq": 1, "ended": False, "applied_offset": 0,
                   "started_event_id": None, "reused": False, "buffer": {"2": [0, False, 7, held.decode()]}}
    log.reads.clear()
    await sequencer.process(log.append(f.completed(1, 0, "a")))
    assert broker.seqs() == [1, 2] and [r.value for r in broker.on(TOPICS.transcript)][1] == held
    assert log.reads == []
    assert states[key]["next_seq"] == 3 and states[key]["buffered"] == {}


def test_the_state_json_tolerates_missing_and_unknown_keys() -> None:
    assert SessionSequence.from_json({"next_seq": 4, "a_later_field": [1, 2]}) == SessionSequence(next_seq=4)
    state = SessionSequence.from_json({"next_seq": 2, "buffered": {"5": [1, True, 40, 300]}})
    assert SessionSequence.from_json(state.to_json()) == state
    assert state.buffer[5].size == 300 and state.buffer[5].ends_session and state.buffer[5].raw is None


async def test_the_reorder_buffer_is_bounded_in_bytes() -> None:
    f = EventFactory()
    log = Log()
    sequencer, states, broker = make(log, max_buffer_bytes=500_000)
    await feed(sequencer, log.append(f.started(), *[f.partial(seq, 0, BIG_TEXT) for seq in range(2, 6)]))
    reasons = [r.reason for r in broker.on(TOPICS.dlq)]
    assert len(states[f.session_id.encode()]["buffered"]) == 2  # 2 x ~200 KB fit in 500 KB; seqs 4 and 5 do not
    assert len(reasons) == 2 and all(r.startswith("overflow: reorder buffer full (") for r in reasons)
    assert [r.value for r in broker.on(TOPICS.dlq)] == [r.value for r in log.records[3:5]]  # their bytes, not a reference


def test_the_worst_state_of_the_default_settings_fits_its_budget_many_times_over() -> None:
    from turnlog.settings import TurnlogSettings

    settings = TurnlogSettings()
    state = SessionSequence(epoch=2**31 - 1, next_seq=2**63 - 1024 - 2, applied_offset=2**63 - 1,
                            started_event_id="f" * 36, reused=True)
    state.fleet = "\U0001f600" * 200  # the longest fleet name, in 4-byte characters
    for seq in range(2**63 - 1 - settings.reorder_buffer_size, 2**63 - 1):
        state.buffer[seq] = Buffered(seq, 2**31 - 1, True, 2**63 - 1, 2**63 - 1)
    size = len(json.dumps(state.to_json(), ensure_ascii=False).encode())
    assert size < MAX_STATE_BYTES / 2 and MAX_STATE_BYTES < MAX_RECORD_BYTES / 3


async def test_a_state_over_its_budget_sends_its_highest_buffered_seqs_to_the_dlq() -> None:
    f = EventFactory()
    log = Log()
    sequencer, states, broker = make(log, max_state_bytes=600)
    await feed(sequencer, log.append(f.started(), *[f.completed(seq, seq - 1, "t") for seq in range(2, 40)]))
    assert max(len(state) for state in broker.states()) <= 600
    kept = sorted(int(seq) for seq in states[f.session_id.encode()]["buffered"])
    dropped = [r for r in broker.on(TOPICS.dlq)]
    assert kept == list(range(2, 2 + len(kept))) and len(kept) + len(dropped) == 38
    assert all(r.reason.startswith("overflow: the session's state would pass 600 bytes") for r in dropped)
    await feed(sequencer, log.append(f.completed(1, 0, "a")))
    assert broker.seqs() == list(range(0, 2 + len(kept)))  # what was kept is released in order


async def test_a_record_too_large_for_the_transcript_goes_to_the_dlq_as_a_reference() -> None:
    f, healthy = EventFactory(), EventFactory()
    log = Log()
    sequencer, _, broker = make(log, max_record_bytes=100_000)
    records = log.append(f.started(), f.partial(1, 0, BIG_TEXT), healthy.started(), healthy.ended(1))
    await sequencer.process(records)
    assert broker.seqs(f.session_id.encode()) == [0] and broker.seqs(healthy.session_id.encode()) == [0, 1]
    [reference] = broker.on(TOPICS.dlq)
    assert reference.value == b"" and reference.key == f.session_id.encode()
    assert reference.reason.startswith("too large: the event would be a ")
    assert reference.headers["turnlog-source-offset"] == b"1"


async def test_a_rejected_record_too_large_for_the_dlq_goes_as_a_reference_with_a_bounded_reason() -> None:
    log = Log()
    sequencer, _, broker = make(log, max_record_bytes=100_000)
    huge_key = b"k" * 200_000  # key and value together: more than a record may have
    await sequencer.process(log.append(b'{"not": "an event"}', key=huge_key))
    [reference] = broker.on(TOPICS.dlq)
    assert reference.value == b"" and reference.key is None  # a key that long is left out too
    assert reference.reason.startswith("too large:") and len(reference.headers["turnlog-reason"]) <= 1024


@pytest.mark.parametrize("atomic", [False, True], ids=["acks", "transactions"])
async def test_a_record_the_broker_refuses_alone_goes_to_the_dlq_and_its_batch_mates_are_sent_again(atomic: bool) -> None:
    f, healthy = EventFactory(), EventFactory()
    log = Log()
    sequencer, states, broker = make(log, atomic=atomic)
    records = log.append(healthy.started(), f.started(), f.completed(1, 0, BIG_TEXT), f.ended(2, last_turn=0),
                         healthy.completed(1, 0, "fine"), healthy.ended(2, last_turn=0))
    big = records[2].value
    broker.refuses = lambda record: record.topic == TOPICS.transcript and record.value == big
    await sequencer.process(records)
    assert broker.refused_batches == 2  # the batch, then the big record alone
    assert broker.seqs(healthy.session_id.encode()) == [0, 1, 2]  # refused with it, then sent again alone
    assert sorted(broker.seqs(f.session_id.encode())) == [0, 2]
    [reference] = broker.on(TOPICS.dlq)
    assert reference.value == b"" and reference.reason.startswith("refused: the broker refused it")
    assert reference.headers["turnlog-source-offset"] == b"2"
    assert states[f.session_id.encode()]["ended"] is True


@pytest.mark.parametrize("atomic", [False, True], ids=["acks", "transactions"])
async def test_a_state_record_the_broker_refuses_is_kept_in_memory_and_the_batch_goes_on(atomic: bool) -> None:
    f = EventFactory()
    log = Log()
    sequencer, states, broker = make(log, atomic=atomic)
    broker.refuses = lambda record: record.topic == CHANGELOG
    await sequencer.process(log.append(f.started(), f.completed(1, 0, "a")))
    assert broker.seqs() == [0, 1] and states[f.session_id.encode()]["next_seq"] == 2


@pytest.mark.parametrize("breaks", ["decode", "sequence", "state"])
async def test_nothing_one_record_causes_escapes_process(monkeypatch: pytest.MonkeyPatch, breaks: str) -> None:
    f, healthy = EventFactory(), EventFactory()
    log = Log()
    sequencer, states, broker = make(log)
    if breaks == "decode":
        real = sequencer_module.decode_event
        monkeypatch.setattr(sequencer_module, "decode_event",
                            lambda raw: (_ for _ in ()).throw(RecursionError()) if raw and b"poison" in raw else real(raw))
        bad = log.append(f.completed(0, 0, "poison"))
    elif breaks == "sequence":
        real_sequence = sequencer_module.sequence
        monkeypatch.setattr(sequencer_module, "sequence", lambda state, event, *a, **k: (
            (_ for _ in ()).throw(KeyError("bug")) if event.session_id == f.session_id else real_sequence(state, event, *a, **k)))
        bad = log.append(f.started())
    else:
        states[f.session_id.encode()] = {"buffered": {"x": "not a position"}}  # an unreadable stored state
        bad = log.append(f.started())
    tombstone = [SourceRecord(None, None, 0, len(log.records))]  # type: ignore[arg-type]
    log.records += tombstone
    await sequencer.process(bad + tombstone + log.append(healthy.started(), healthy.ended(1)))
    assert broker.seqs() == [0, 1]  # the healthy session only
    reasons = [r.reason for r in broker.on(TOPICS.dlq)]
    assert len(reasons) == 2 and reasons[1].startswith("invalid: the record has no value")
    assert reasons[0].startswith("internal: ")


async def test_a_broker_away_while_buffered_events_are_read_again_fails_the_batch_before_anything_is_sent() -> None:
    f = EventFactory()
    log = Log()
    sequencer, states, broker = make(log, held_read_timeout=0)
    await feed(sequencer, log.append(f.started(), f.completed(2, 1, "b")))
    before = dict(states)
    sent = len(broker.sent)
    log.failure = kafka.BrokerUnavailableError("broker away", retriable=True)
    with pytest.raises(kafka.BrokerError):
        await sequencer.process(log.append(f.completed(1, 0, "a")))
    assert len(broker.sent) == sent and states == before  # nothing sent, nothing stored: the batch is redone


@pytest.mark.parametrize("atomic", [False, True], ids=["acks", "transactions"])
async def test_a_dlq_record_the_broker_refuses_goes_as_a_reference_and_a_refused_reference_stops_the_batch(atomic: bool) -> None:
    f = EventFactory()
    log = Log()
    sequencer, states, broker = make(log, atomic=atomic)
    broker.refuses = lambda record: record.topic == TOPICS.dlq and len(record.value or b"") > 1_000
    invalid = b'{"type": "turn.partial", "text": "%s"}' % (b"y" * 5_000)
    await sequencer.process(log.append(invalid, f.started(), key=f.session_id.encode()))
    [reference] = broker.on(TOPICS.dlq)
    assert reference.value == b"" and reference.reason.startswith("invalid: ")
    assert "; its bytes are left out: the broker refused it" in reference.reason
    assert broker.seqs() == [0]

    broker.refuses = lambda record: record.topic == TOPICS.dlq  # not even a reference fits: the deployment is broken
    before, sent = dict(states), len(broker.sent)
    with pytest.raises(EmissionFailed):
        await sequencer.process(log.append(b"not json", f.completed(1, 0, "a"), key=f.session_id.encode()))
    assert states == before and len(broker.sent) == sent  # no state stored: the batch is processed again
