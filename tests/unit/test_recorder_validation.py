"""The recorder rejects bad input before anything is sent (pure validation; no broker)."""

import asyncio
import datetime as dt

import pytest

from turnlog.producers import InvalidTurnError, SessionClosedError
from turnlog.producers.drainer import Ticket
from turnlog.producers.recorder import RecordedSession
from turnlog.schemas import decode_event
from turnlog.schemas.session_keys import session_key
from turnlog.settings import TurnlogSettings


class RecordingSend:
    """Stands in for SessionRecorder: records what would be spooled, and acknowledges it at once."""

    def __init__(self):
        self.settings = TurnlogSettings(max_text_bytes=32)
        self.producer_id = "unit"
        self.redactor = None  # nothing masked (tests/unit/test_pii.py covers the recorder's redaction)
        self.sent = []

    def _turn_span(self, *_args, **_kwargs):
        return None  # tracing off

    def _spool(self, session, payload, trace=None):
        self.sent.append(payload)
        ticket = Ticket()
        ticket.spooled.set_result(None)
        ticket.acked.set_result(None)
        return ticket

    async def _await_durable(self, ticket, span=None):
        await asyncio.wrap_future(ticket.spooled)

    def _forget(self, session):
        pass


@pytest.fixture
def session():
    return RecordedSession(RecordingSend(), session_key("f", "s-1"), fleet="f", epoch=0, next_seq=1, next_turn_index=0)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-1, "A", "hi"), "turn_index"),
        ((True, "A", "hi"), "turn_index"),
        (("0", "A", "hi"), "turn_index"),
        ((0, "", "hi"), "speaker"),
        ((0, 7, "hi"), "speaker"),
        ((0, "A", b"hi"), "text must be a str"),
        ((0, "A", "é" * 17), "34 bytes; the limit is 32 bytes"),
        ((2**31, "A", "hi"), "turn_index"),
        ((0, "A", "a\x00b"), "NUL"),
        ((0, "A\x00", "hi"), "NUL"),
        ((0, "A", "a\ud800b"), "not valid Unicode"),
        ((0, "\udfff", "hi"), "not valid Unicode"),
    ],
)
async def test_invalid_turns_raise_before_sending(session, args, match):
    with pytest.raises(InvalidTurnError, match=match):
        await session.complete_turn(*args)
    with pytest.raises(InvalidTurnError, match=match):
        session.update_partial(*args)
    assert session._recorder.sent == [] and session.next_seq == 1


async def test_tokens_and_times_are_checked(session):
    with pytest.raises(InvalidTurnError, match="input_tokens"):
        await session.complete_turn(0, "A", "x", input_tokens=-1)
    with pytest.raises(InvalidTurnError, match="timezone-aware"):
        await session.complete_turn(0, "A", "x", started_at=dt.datetime(2026, 1, 1))
    with pytest.raises(InvalidTurnError, match="years"):
        await session.complete_turn(0, "A", "x", started_at=dt.datetime(1, 1, 1, 0, 30, tzinfo=dt.timezone(dt.timedelta(hours=1))))
    with pytest.raises(InvalidTurnError, match="arguments must be a mapping"):
        await session.complete_turn(0, "A", "x", tool_calls=[{"name": "lookup", "arguments": [1, 2]}])
    now = dt.datetime.now(dt.UTC)
    with pytest.raises(InvalidTurnError, match="before started_at"):
        await session.complete_turn(0, "A", "x", started_at=now, ended_at=now - dt.timedelta(seconds=1))
    assert session._recorder.sent == []


SECRET = "the caller's card number 4111 1111 1111 1111"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tool_calls": [("lookup", {"card": SECRET})]}, "got tuple of length 2"),
        ({"tool_calls": [{"arguments": {"card": SECRET}, "result": SECRET}]}, "got a mapping without 'name'"),
        ({"input_tokens": SECRET}, "input_tokens must be an int >= 0, got str of length"),
        ({"barged_in": SECRET}, "barged_in must be a bool, got str of length"),
        ({"started_at": SECRET}, "timezone-aware datetime, got str of length"),
    ],
)
async def test_a_wrong_value_is_named_by_its_type_never_quoted(session, kwargs, match):
    # The adapters log these errors; a wrong value may be words or tool arguments encryption would seal.
    with pytest.raises(InvalidTurnError, match=match) as refused:
        await session.complete_turn(0, "A", "x", **kwargs)
    assert "4111" not in str(refused.value)
    with pytest.raises(InvalidTurnError, match="speaker") as refused:
        await session.complete_turn(0, SECRET * 10, "x")
    assert "4111" not in str(refused.value)
    assert session._recorder.sent == []


async def test_a_wrong_number_is_shown_as_it_is(session):
    with pytest.raises(InvalidTurnError, match=r"input_tokens must be an int >= 0, got -3"):
        await session.complete_turn(0, "A", "x", input_tokens=-3)
    with pytest.raises(InvalidTurnError, match=r"turn_index must be an int from 0 to \d+, got 2147483648"):
        await session.complete_turn(2**31, "A", "x")
    with pytest.raises(InvalidTurnError, match=r"turn_index must be an int from 0 to \d+, got str of length 1"):
        await session.complete_turn("0", "A", "x")


async def test_turn_order_and_several_open_turns(session):
    await session.complete_turn(0, "A", "first")
    with pytest.raises(InvalidTurnError, match="already recorded"):
        await session.complete_turn(0, "A", "again")
    with pytest.raises(InvalidTurnError, match="already recorded"):
        session.update_partial(0, "A", "reopen")
    session.update_partial(1, "B", "open")
    session.update_partial(2, "A", "overlapping")  # a second open turn: overlapping speech
    assert session.open_turns == (1, 2)
    with pytest.raises(InvalidTurnError, match="spoken by"):
        session.update_partial(1, "A", "open more")
    with pytest.raises(InvalidTurnError, match="spoken by"):
        await session.complete_turn(2, "B", "overlapping speech")
    await session.complete_turn(2, "A", "overlapping speech", barged_in=True)  # completed before turn 1
    await session.flush_partial()
    assert session.open_turns == (1,) and session.next_turn_index == 3
    events = [decode_event(p) for p in session._recorder.sent]
    assert [(type(e).__name__, e.turn_index) for e in events] == [
        ("TurnCompleted", 0), ("TurnCompleted", 2), ("TurnPartial", 1)
    ]
    assert events[1].barged_in and not events[0].barged_in


async def test_end_keeps_every_open_partial(session):
    session.update_partial(0, "A", "one")
    session.update_partial(1, "B", "two")
    await session.end("hangup")
    events = [decode_event(p) for p in session._recorder.sent]
    assert [type(e).__name__ for e in events] == ["TurnPartial", "TurnPartial", "SessionEnded"]
    assert events[-1].last_turn_index == 1


async def test_nothing_is_sent_after_the_end(session):
    session.update_partial(0, "A", "bye")
    await session.end("hangup")
    sent = len(session._recorder.sent)
    assert sent == 2  # the open partial, then session.ended
    with pytest.raises(SessionClosedError):
        await session.complete_turn(1, "A", "late")
    with pytest.raises(SessionClosedError):
        await session.end()
    assert len(session._recorder.sent) == sent


async def test_seq_is_strictly_increasing(session):
    from turnlog.schemas import decode_event

    session.update_partial(0, "A", "a")
    await session.flush_partial()
    await session.flush_partial()  # unchanged text: nothing new
    session.update_partial(0, "A", "a b")
    await session.complete_turn(0, "A", "a b c")
    assert [decode_event(p).seq for p in session._recorder.sent] == [1, 2]


async def test_a_recorder_that_was_not_started_says_so(tmp_path):
    from turnlog.producers import RecorderError, SessionRecorder

    recorder = SessionRecorder(TurnlogSettings(spool_dir=str(tmp_path)))
    with pytest.raises(RecorderError, match="not started"):
        await recorder.start_session("s-1", fleet="f", agent_id="a")
    with pytest.raises(RecorderError, match="not started"):
        await recorder.resume("s-1", timeout=1)
    assert list(tmp_path.iterdir()) == []  # no I/O before start()


async def test_an_event_too_large_for_kafka_is_refused_before_it_takes_a_seq(session):
    # Each result is under the schema's own bound (MAX_TOOL_VALUE_BYTES); together they are too large for Kafka.
    huge = [{"name": "lookup", "result": "x" * 240_000} for _ in range(4)]
    with pytest.raises(InvalidTurnError, match="bytes encoded"):
        await session.complete_turn(0, "A", "ok", tool_calls=huge)
    assert session._recorder.sent == [] and session.next_seq == 1
    await session.complete_turn(0, "A", "ok")  # the turn can still be recorded
    assert session.next_seq == 2
