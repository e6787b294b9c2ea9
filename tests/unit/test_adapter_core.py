"""The adapters' shared core (turnlog.adapters._core), without a framework or a broker."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

import pytest

from turnlog.adapters._core import (
    OrderedWriter,
    PendingToolCalls,
    PendingUsage,
    after_latest_match,
    arguments_object,
    conversation,
    framework_ids,
)
from turnlog.producers import InvalidTurnError, StoredTurn
from turnlog.schemas import ToolCall
from turnlog.schemas.events import MAX_TOOL_VALUE_BYTES

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def stored(index: int, speaker: str, text: str, status: str = "complete") -> StoredTurn:
    return StoredTurn(index, speaker, text, status, T0, None, 0, 0, None)


# -- the ordered writer ------------------------------------------------------------------
async def test_the_writer_applies_items_in_order_and_stops_after_the_last() -> None:
    applied: list[int] = []
    stopped = asyncio.Event()

    async def apply(item: int) -> None:
        await asyncio.sleep(0.001 * (5 - item))  # later items would finish first if run concurrently
        applied.append(item)

    async def on_stop() -> None:
        stopped.set()

    writer: OrderedWriter[int] = OrderedWriter("s-1", apply, name="test-writer", on_stop=on_stop)
    for item in range(4):
        writer.put(item)
    writer.put(4, last=True)
    writer.put(5)  # after the last: dropped
    assert await writer.wait_closed(timeout=5)
    assert applied == [0, 1, 2, 3, 4]
    assert stopped.is_set() and writer.closed and writer.stopping


async def test_a_recorder_error_or_a_bug_costs_one_item_not_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    applied: list[str] = []
    secret = "the caller's card number"

    async def apply(item: str) -> None:
        if item == "refused":
            raise InvalidTurnError("text is 70000 bytes, over the limit")
        if item == "bug":
            raise KeyError(secret)
        applied.append(item)

    writer: OrderedWriter[str] = OrderedWriter("s-2", apply, name="test-writer")
    with caplog.at_level(logging.ERROR):
        for item in ("a", "refused", "b", "bug", "c"):
            writer.put(item)
        await writer.drained()
    assert applied == ["a", "b", "c"]
    assert writer.failures == 2
    assert [type(e) for e in writer.errors] == [InvalidTurnError]
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and all("s-2" in m for m in logged)
    assert not any(secret in m for m in logged)  # a bug's message may hold content: never logged


async def test_drained_returns_at_once_when_nothing_was_put() -> None:
    async def apply(item: int) -> None:
        raise AssertionError("nothing to apply")

    writer: OrderedWriter[int] = OrderedWriter("s-3", apply, name="test-writer")
    await asyncio.wait_for(writer.drained(), 1)
    assert not await writer.wait_closed(timeout=0.01)



async def test_wait_closed_before_the_first_item_returns_when_the_last_is_applied() -> None:
    """A caller may wait for the writer's close before anything was put (Pipecat's
    ``TurnlogObserver.wait_closed`` right after the pipeline starts): it waits, not
    returns False at once, and returns True after the last item and ``on_stop``."""
    applied: list[int] = []
    stopped: list[bool] = []

    async def apply(item: int) -> None:
        applied.append(item)

    async def on_stop() -> None:
        stopped.append(True)

    writer: OrderedWriter[int] = OrderedWriter("s-4", apply, name="test-writer", on_stop=on_stop)
    waiter = asyncio.ensure_future(writer.wait_closed())
    await asyncio.sleep(0)  # the waiter is waiting before the first put
    assert not waiter.done() and not writer.closed
    writer.put(1)
    await writer.drained()
    assert not waiter.done()  # an item that is not the last does not close it
    writer.put(2, last=True)
    assert await asyncio.wait_for(waiter, 5) is True
    assert applied == [1, 2] and stopped == [True] and writer.closed
    assert await writer.wait_closed(timeout=0)  # already closed: True at once

# -- tokens and tool calls -------------------------------------------------------------------
def test_pending_usage_sums_calls_until_taken() -> None:
    usage = PendingUsage()
    usage.add(10, 2)
    usage.add(None, 3)
    assert usage.take() == (10, 5)
    assert usage.take() == (0, 0)


def test_pending_tool_calls_keep_call_order_and_results() -> None:
    calls = PendingToolCalls()
    assert not calls
    calls.call("c1", "lookup", '{"order": 42}')
    calls.call("c2", "refund", {"amount": 5})
    assert calls.result("c2", "done")
    assert not calls.result("unknown", "ignored")
    assert calls.take() == (
        ToolCall(name="lookup", arguments={"order": 42}, result=None),
        ToolCall(name="refund", arguments={"amount": 5}, result="done"),
    )
    assert not calls and calls.take() == ()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ("[1, 2]", {"value": [1, 2]}),
        ("not json", {"raw": "not json"}),
        ("", {}),
        (None, {}),
        ({"b": 2}, {"b": 2}),
    ],
)
def test_arguments_are_always_a_json_object(raw: object, expected: dict[str, object]) -> None:
    assert arguments_object(raw) == expected


# -- the rebuilt history ---------------------------------------------------------------------
def test_the_conversation_is_user_and_assistant_turns_with_text_in_turn_order() -> None:
    turns = [
        stored(3, "assistant", "cut", status="partial"),
        stored(0, "user", "hi"),
        stored(2, "tool", "result"),
        stored(1, "assistant", ""),
        stored(4, "user", "bye", status="interrupted"),
    ]
    assert [t.turn_index for t in conversation(turns, unfinished=False)] == [0]
    assert [t.turn_index for t in conversation(turns, unfinished=True)] == [0, 3, 4]


@pytest.mark.parametrize(
    ("known", "sequence", "expected"),
    [
        ([], ["a", "b"], 0),  # nothing known: all of the sequence is past it
        (["a", "b"], ["a", "b", "c"], 2),  # the sequence goes on past what is known
        (["a", "b"], ["a", "b"], 2),  # equal: nothing past it
        (["x", "a", "b"], ["a", "b", "c"], 2),  # the sequence begins later (a trimmed history)
        (["a", "b"], ["a", "b", "a", "b", "c"], 4),  # the latest stretch
        (["a", "z"], ["a", "b", "c"], None),  # edited
        (["a"], [], None),
    ],
)
def test_after_latest_match(known: list[str], sequence: list[str], expected: int | None) -> None:
    assert after_latest_match(known, sequence) == expected


async def test_a_forgotten_session_is_logged_once_and_the_writer_goes_on_to_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from turnlog.producers import SessionErasedError

    applied: list[str] = []
    stopped: list[bool] = []

    async def apply(item: str) -> None:
        applied.append(item)
        if item != "before":
            raise SessionErasedError("s-erased")

    async def on_stop() -> None:
        stopped.append(True)

    writer: OrderedWriter[str] = OrderedWriter("s-erased", apply, name="test-writer", on_stop=on_stop)
    with caplog.at_level(logging.DEBUG, logger="turnlog.adapters._core"):
        for item in ("before", *[f"after-{i}" for i in range(50)]):
            writer.put(item)
        writer.put("end", last=True)
        assert await writer.wait_closed(10)
    assert applied[0] == "before" and len(applied) == 52 and stopped == [True]
    assert writer.erased and [type(e) for e in writer.errors] == [SessionErasedError]
    assert writer.failures == 51
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


# -- the framework's ids on the recorder's spans -------------------------------------------
def test_framework_ids_keep_what_a_span_attribute_may_hold_and_leave_out_the_rest() -> None:
    """Only non-empty valid text of at most 256 UTF-8 bytes (the recorder's bound on a trace
    attribute's value): anything else would make the recorder refuse the turn, so it is left out."""
    ids = framework_ids({
        "lk.speech_id": "SH_abc123",
        "at.the.bound": "é" * 128,  # 256 bytes
        "over.the.bound": "é" * 128 + "x",  # 257 bytes
        "missing": None,
        "empty": "",
        "a.number": 7,
        "a.lone.surrogate": "\ud800",
    })
    assert ids == {"lk.speech_id": "SH_abc123", "at.the.bound": "é" * 128}


def test_framework_ids_leave_out_what_would_take_the_span_past_the_recorders_bounds() -> None:
    """With the attributes the span has already (the session's, some the application's), an id
    that would break the recorder's bounds per span (16 attributes, 2048 bytes of names and
    values) is left out, so the turn is never refused; what is kept passes the recorder's check."""
    from turnlog.producers import recorder

    fifteen = {f"app.{i}": "v" for i in range(15)}
    ids = {"lk.speech_id": "SH_1", "lk.job_id": "AJ_1"}
    assert framework_ids(ids, beside=fifteen) == {"lk.speech_id": "SH_1"}  # the 16th attribute, not a 17th
    fourteen = {f"app.{i}": "v" for i in range(14)}
    assert framework_ids(ids, beside={**fourteen, "lk.job_id": "old"}) == ids  # one replaced: 16 in all

    large = {f"app.{i}": "x" * 250 for i in range(7)}  # 1785 bytes: 263 left
    thread = {"langsmith.metadata.thread_id": "t" * 230, "lk.speech_id": "SH_1"}  # 258 bytes, then 16
    assert framework_ids(thread, beside=large) == {"langsmith.metadata.thread_id": "t" * 230}
    for beside, chosen in ((fifteen, framework_ids(ids, beside=fifteen)), (large, framework_ids(thread, beside=large))):
        assert recorder._trace_attributes({**beside, **chosen})  # raises InvalidTurnError if a bound is broken
    with pytest.raises(InvalidTurnError):  # what the bound is there for
        recorder._trace_attributes({**large, **thread})


def test_a_tool_value_the_schema_refuses_is_omitted_and_never_holds_the_other_calls_or_later_turns() -> None:
    pending = PendingToolCalls()
    pending.call("c1", "fetch_page", '{"url": "https://example.com"}')
    pending.result("c1", "x" * (MAX_TOOL_VALUE_BYTES + 1))  # a web page: over the schema's bound
    pending.call("c2", "lookup", '{"q": 1}')
    pending.result("c2", "fine")
    calls = pending.take()
    assert [(c.name, c.arguments, c.result) for c in calls] == [
        ("fetch_page", {"url": "https://example.com"}, {"omitted": "str"}),
        ("lookup", {"q": 1}, "fine"),
    ]
    assert pending.take() == () and not pending  # nothing left behind to fail the next turn
    pending.call("c3", "huge_args", {"blob": "y" * (MAX_TOOL_VALUE_BYTES + 1)})
    [call] = pending.take()
    assert (call.arguments, call.result) == ({"omitted": "dict"}, None)
