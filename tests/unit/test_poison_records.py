"""Poison records in the consumers' pure parts: any failure of one record refuses (or skips) that record alone,
with a reason that names the failure and never the content, and the others are planned as if it were not there."""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import pytest

from turnlog.ops import replay, tail, verify
from turnlog.schemas import encode_event
from turnlog.schemas.events import MAX_EVENT_DEPTH
from turnlog.sinks import SourceMessage
from turnlog.sinks import batch as sink_batch
from turnlog.sinks.batch import plan_batch
from turnlog.sinks.reads import StoredEvent
from turnlog.stream_processors.sequencing import SessionSequence

from tests.support import EventFactory, messages

SECRET = "the caller's card number 4111"


def deep_metadata_started(f: EventFactory, depth: int = 1_000) -> bytes:
    """``f``'s session.started with a metadata nested ``depth`` levels (it used to raise RecursionError)."""
    return encode_event(f.started())[:-1] + b',"metadata":{"k":' + b"[" * depth + b"]" * depth + b"}}"


def fail_for_text(monkeypatch, text: str) -> None:
    """Make planning raise (a planning bug) for the turn whose text is ``text``, and only for it."""
    from_event = sink_batch.TurnRow.from_event

    def planned(event):
        if event.text == text:
            raise RuntimeError(f"bug while planning {event.text}")
        return from_event(event)

    monkeypatch.setattr(sink_batch.TurnRow, "from_event", staticmethod(planned))


def test_plan_batch_refuses_a_deep_record_and_a_record_whose_planning_raises_and_plans_the_rest(monkeypatch, caplog):
    healthy, poisoned = EventFactory("healthy"), EventFactory("poisoned")
    fail_for_text(monkeypatch, SECRET)
    batch = messages([healthy.started(), healthy.completed(1, 0, "hello")])
    batch += [SourceMessage("t.transcript", 0, 2, deep_metadata_started(poisoned))]
    batch += messages([poisoned.completed(1, 0, SECRET), healthy.completed(2, 1, "bye"), healthy.ended(3, last_turn=1)],
                      first_offset=3)
    with caplog.at_level(logging.WARNING):
        plan = plan_batch(batch)
    assert [(r.message.offset, r.reason) for r in plan.rejected] == [
        (2, f"the event's JSON nests deeper than {MAX_EVENT_DEPTH} levels (metadata, tool arguments and results may "
            "nest 32)"),
        (3, "cannot be planned (RuntimeError)"),
    ]
    assert set(plan.sessions) == {"healthy"} and plan.sessions["healthy"].seqs == {0, 1, 2, 3}
    assert [(t.session_id, t.turn_index, t.text) for t in plan.turns] == [("healthy", 0, "hello"), ("healthy", 1, "bye")]
    assert [(r["session_id"], r["seq"]) for r in plan.event_rows] == [("healthy", s) for s in range(4)]
    assert plan.next_offsets == {("t.transcript", 0): 6}  # the refused records' offsets are passed too
    assert "t.transcript[0]@3" in caplog.text and SECRET not in caplog.text


def test_a_tombstone_is_refused_not_a_crash():
    plan = plan_batch([SourceMessage("t.transcript", 0, 0, None)])  # type: ignore[arg-type]
    assert [r.reason for r in plan.rejected] == ["the record has no value"]


def test_analytics_refuses_a_record_whose_decoding_raises_anything(monkeypatch):
    from turnlog.sinks import analytics

    f = EventFactory("healthy")
    good = messages([f.started(), f.completed(1, 0, "hi")])
    poison = SourceMessage("t.transcript", 0, 2, b'{"poison": true}')
    real = analytics.decode_event

    def decode(value):
        if value == poison.value:
            raise RecursionError("maximum recursion depth exceeded")  # as before decode_event bounded nesting
        return real(value)

    monkeypatch.setattr(analytics, "decode_event", decode)
    written = []

    class Store:
        def insert(self, table):
            raise AssertionError("not reached: the writes are replaced below")

    projection = analytics.AnalyticsProjection(Store())  # type: ignore[arg-type]
    monkeypatch.setattr(projection, "_count_starts", lambda conn, starts: written.append(sorted(starts)))
    monkeypatch.setattr(projection, "_count_turns", lambda conn, turns: written.append(sorted(turns)))
    result = projection.write(None, [*good, poison, SourceMessage("t.transcript", 0, 3, deep_metadata_started(f))])  # type: ignore[arg-type]
    assert [(r.message.offset, r.reason.split(" (")[0]) for r in result.rejected] == [
        (2, "cannot be planned"), (3, f"the event's JSON nests deeper than {MAX_EVENT_DEPTH} levels"),
    ]
    assert written == [["healthy"], [("healthy", 0)]]


class LogRecord(SimpleNamespace):
    """A consumed record as replay reads it (confluent_kafka.Message's accessors)."""

    def value(self):
        return self.raw

    def offset(self):
        return self.at

    def topic(self):
        return "t.events"

    def partition(self):
        return 1

    def key(self):
        return self.session_key

    def headers(self):
        return None


def test_replay_skips_and_counts_a_record_that_cannot_be_decoded_or_sequenced(monkeypatch, caplog):
    f = EventFactory("replayed")
    states: dict[str, SessionSequence | None] = {"replayed": SessionSequence()}
    emitted: list[SourceMessage] = []
    result = replay.ReplayResult()
    real_sequence = replay.sequence

    def sequence(state, event, raw, offset, **kwargs):
        if getattr(event, "text", None) == SECRET:
            raise KeyError(SECRET)
        return real_sequence(state, event, raw, offset, **kwargs)

    monkeypatch.setattr(replay, "sequence", sequence)
    records = [encode_event(f.started()), deep_metadata_started(EventFactory("other"), 50_000),
               encode_event(f.completed(1, 0, SECRET)), b"\xff not json", encode_event(f.completed(1, 0, "kept"))]
    with caplog.at_level(logging.WARNING):
        for at, raw in enumerate(records):
            record = LogRecord(raw=raw, at=at, session_key=b"other" if at == 1 else f.session_id.encode())
            replay._sequence_record(None, record, states, set(), emitted, result, max_buffer=10)  # type: ignore[arg-type]
    assert result.rejected == 3
    assert sum(result.rejected_reasons.values()) == 3 and result.rejected_reasons["internal"] == 1
    assert [m.offset for m in emitted] == [0, 4]
    assert "t.events[1]@2" in caplog.text and SECRET not in caplog.text


def test_verify_reports_a_session_it_cannot_digest_instead_of_stopping(caplog):
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    fine = verify._digest("fine", {"metadata": {"k": 1}}, [], [])
    with caplog.at_level(logging.WARNING):
        broken = verify._digest("broken", {"metadata": deep}, [], [])
    assert broken.error == "RecursionError" and "broken" in caplog.text
    differences = verify.compare_digests({"fine": fine, "broken": broken}, {"fine": fine, "broken": broken})
    assert [(d.session_id, d.what) for d in differences] == [
        ("broken", "cannot be digested in A (RecursionError) and in B (RecursionError)")
    ]


async def test_tail_skips_an_event_it_cannot_show_and_counts_it(monkeypatch, caplog, tmp_path):
    f = EventFactory("tailed")
    events = [
        StoredEvent(0, "session.started", encode_event(f.started()).decode()),
        StoredEvent(1, "turn.completed", '{"metadata":' + "[" * 5_000 + "]" * 5_000 + "}"),
        StoredEvent(2, "turn.completed", '{"text": "' + SECRET + '"}'),  # no speaker: KeyError
        StoredEvent(3, "turn.completed", "not json " + SECRET),
        StoredEvent(4, "session.ended", encode_event(f.ended(4)).decode()),
    ]

    async def follow(fetch, hub, session_id, after_seq, **kwargs):
        for event in events:
            yield event

    class Hub:
        def __init__(self, settings, *, store=None):
            pass

        def start(self):
            pass

        def stop(self):
            pass

    reads = SimpleNamespace(session=lambda session_id, fleets: object())
    store = SimpleNamespace(reading=lambda: contextlib.nullcontext(reads))
    monkeypatch.setattr(tail, "follow_session", follow)
    monkeypatch.setattr(tail, "TranscriptHub", Hub)
    monkeypatch.setattr(tail, "store_fetch", lambda store: None)
    out = (tmp_path / "out.txt").open("w+")
    with caplog.at_level(logging.WARNING):
        result = await tail.tail_session(SimpleNamespace(api_poll_seconds=0.1), store, "tailed", out=out)  # type: ignore[arg-type]
    out.seek(0)
    assert result == tail.TailResult(found=True, skipped=3)
    assert [line.split(" ")[0] for line in out.read().splitlines()] == ["[0]", "[4]"]
    assert "seq 1" in caplog.text and "seq 2" in caplog.text and SECRET not in caplog.text


@pytest.mark.parametrize("depth", [MAX_EVENT_DEPTH + 1, 100_000])
def test_format_event_refuses_a_payload_nested_too_deep_with_a_typed_error(depth):
    from turnlog.schemas import EventValidationError

    with pytest.raises(EventValidationError):
        tail.format_event(StoredEvent(1, "turn.completed", '{"text":' + "[" * depth + "]" * depth + "}"))
