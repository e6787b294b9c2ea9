"""The OpenAI Agents SDK adapter, driven by the SDK's own Runner with a fake Model,
on the real broker and Postgres (and, for the crash, a real agent process)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.support import recorder_for, require_extra

require_extra("agents.memory", "openai-agents")

from types import SimpleNamespace

from agents import (
    Agent,
    GuardrailFunctionOutput,
    InputGuardrailTripwireTriggered,
    OpenAIChatCompletionsModel,
    OutputGuardrailTripwireTriggered,
    RunConfig,
    Runner,
    SQLiteSession,
    function_tool,
    input_guardrail,
    output_guardrail,
    set_trace_processors,
    set_tracing_disabled,
)
from agents.tracing import TracingProcessor
from agents.tracing.processors import default_processor
from sqlalchemy import select

from turnlog.adapters.openai_agents import TurnlogSession
from turnlog.schemas.session_keys import session_key
from turnlog.sinks.tables import session_events, transcript_turns

from tests.adapters.openai_agents_fakes import FakeModel, Reply, fake_chat_client
from tests.adapters.scripted import TURNS_AFTER_A_KILL_MID_ANSWER, kill_mid_answer_then_resume
from tests.adapters.stored import FLEET, turns
from tests.integration.test_pipeline import finalized
from tests.progress import ScriptProcess
from tests.support import wait_until

TIMEOUT = 120
set_tracing_disabled(True)


@function_tool
def order_status(order: str) -> str:
    """The shipping status of an order."""
    return f"order {order} ships tomorrow"


def texts(items):
    """(role, text) of the user and assistant messages among SDK items."""
    out = []
    for item in items:
        content = item.get("content")
        if item.get("type", "message") != "message" or item.get("role") not in ("user", "assistant"):
            continue
        out.append((item["role"], content if isinstance(content, str) else "".join(p.get("text", "") for p in content)))
    return out


def held_and_stored(pipeline, key, items):
    """The inner session's (role, text) messages, and the complete turns of the session keyed ``key``
    that the framework holds (a barged-in turn is what the user saw of an answer the run never saved)."""
    stored = [(t[1], t[2]) for t in turns(pipeline, key) if t[3] == "complete" and not t[6]]
    return texts(items), stored


async def test_runner_run_records_user_and_assistant_turns_with_tokens_and_tool_calls(pipeline):
    session_id = f"oa-run-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    model = FakeModel([
        Reply(call=("order_status", '{"order": "42"}'), input_tokens=11, output_tokens=3),
        Reply(text="Your order 42 ships tomorrow.", input_tokens=25, output_tokens=7),
        Reply(text="You're welcome!", input_tokens=40, output_tokens=4),
    ])
    agent = Agent(name="support", instructions="Help with orders.", model=model, tools=[order_status])
    inner = SQLiteSession(session_id)
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, inner, fleet=FLEET, agent_id="support")
        first = await Runner.run(agent, "Where is order 42?", session=session, hooks=session.hooks)
        second = await Runner.run(agent, "Thanks!", session=session, hooks=session.hooks)
        await session.end("completed")
    assert (first.final_output, second.final_output) == ("Your order 42 ships tomorrow.", "You're welcome!")

    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    call = {"name": "order_status", "arguments": {"order": "42"}, "result": "order 42 ships tomorrow"}
    assert turns(pipeline, key) == [
        (0, "user", "Where is order 42?", "complete", 0, 0, False, None),
        (1, "assistant", "Your order 42 ships tomorrow.", "complete", 36, 10, False, [call]),
        (2, "user", "Thanks!", "complete", 0, 0, False, None),
        (3, "assistant", "You're welcome!", "complete", 40, 4, False, None),
    ]
    row = finalized(pipeline, key)
    assert (row["turn_count"], row["input_tokens"], row["output_tokens"]) == (4, 76, 14)
    # The inner session holds every item, the tool call and its output included; the model saw the history.
    items = await inner.get_items()
    assert texts(items) == [("user", "Where is order 42?"), ("assistant", "Your order 42 ships tomorrow."), ("user", "Thanks!"), ("assistant", "You're welcome!")]
    assert [i.get("type") for i in items if i.get("type") in ("function_call", "function_call_output")] == ["function_call", "function_call_output"]
    assert texts(model.calls[2]) == texts(items)[:3]


class SdkTraces(TracingProcessor):
    """The SDK's own traces, as its tracing processors see them: (trace id, group id) of each
    trace started. Nothing is exported."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str | None]] = []

    def on_trace_start(self, trace) -> None:
        self.started.append((trace.trace_id, trace.export()["group_id"]))

    def on_trace_end(self, trace) -> None:
        pass

    def on_span_start(self, span) -> None:
        pass

    def on_span_end(self, span) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


async def test_the_turn_spans_carry_the_sdks_trace_group_and_response_ids(pipeline, recorder_spans):
    """With turnlog's tracing on and the SDK's too, each turn's span carries the trace id and
    group id of the SDK's trace of the run that saved it, and an assistant turn's span the id of
    the model response that produced it (a plain run, a streamed one, then a streamed one cut
    mid-answer after a tool call: its response never completed, so it has no response id, not
    the tool call's)."""
    session_id = f"oa-trace-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    group_id = f"thread-{uuid.uuid4().hex[:8]}"
    model = FakeModel([
        Reply(call=("order_status", '{"order": "42"}')),  # resp_1: tool calls only, no turn
        Reply(text="Your order 42 ships tomorrow."),  # resp_2
        Reply(text="You're welcome!"),  # resp_3, streamed
        Reply(call=("order_status", '{"order": "7"}')),  # resp_4, streamed: tool calls only
        Reply(text="Let me read you the whole terms and conditions now.", hold=2),  # cut: never completed
    ])
    agent = Agent(name="support", instructions="Help with orders.", model=model, tools=[order_status])
    traces = SdkTraces()
    set_trace_processors([traces])
    set_tracing_disabled(False)
    try:
        async with recorder_for(pipeline.settings) as recorder:
            session = await TurnlogSession.open(recorder, SQLiteSession(session_id), fleet=FLEET, agent_id="support")
            run_config = RunConfig(group_id=group_id)
            await Runner.run(agent, "Where is order 42?", session=session, hooks=session.hooks, run_config=run_config)
            streamed = Runner.run_streamed(agent, "Thanks!", session=session, hooks=session.hooks, run_config=run_config)
            async for _ in session.stream(streamed):
                pass
            cut = Runner.run_streamed(agent, "And order 7?", session=session, hooks=session.hooks, run_config=run_config)
            deltas = 0
            async for event in session.stream(cut):
                if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                    deltas += 1
                    if deltas == 2:
                        cut.cancel()  # the user stops the answer
            await session.end("completed")
    finally:
        set_tracing_disabled(True)
        set_trace_processors([default_processor()])

    [(first, first_group), (second, second_group), (third, third_group)] = traces.started
    assert len({first, second, third}) == 3 and first_group == second_group == third_group == group_id
    spans = recorder_spans.turns(key)
    ids = ("openai.agents.trace_id", "openai.agents.group_id", "gen_ai.response.id")
    assert [(index, *(spans[index].get(key) for key in ids)) for index in sorted(spans)] == [
        (0, first, group_id, None),
        (1, first, group_id, "resp_2"),
        (2, second, group_id, None),
        (3, second, group_id, "resp_3"),
        (4, third, group_id, None),
        (5, third, group_id, None),
    ]
    assert spans[5]["turnlog.speaker"] == "assistant"


async def test_run_streamed_records_the_partial_then_completes_the_same_turn(pipeline):
    session_id = f"oa-stream-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    answer = "Sure, the premium plan costs twelve euros a month."
    reply = Reply(text=answer, input_tokens=9, output_tokens=11, hold=4)
    agent = Agent(name="sales", model=FakeModel([reply]))
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, SQLiteSession(session_id), fleet=FLEET, agent_id="sales")
        result = Runner.run_streamed(agent, "How much is premium?", session=session, hooks=session.hooks)
        deltas = 0
        async for event in session.stream(result):
            if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                deltas += 1
                if deltas == 4:  # the model holds here: the partial is what the user saw so far
                    await session.recorded.flush_partial()
                    partial = await asyncio.to_thread(
                        wait_until, lambda: [t for t in turns(pipeline, key) if t[0] == 1],
                        timeout=TIMEOUT, what="the streamed partial stored",
                    )
                    assert partial == [(1, "assistant", "Sure, the premium plan ", "partial", 0, 0, False, None)]
                    reply.release.set()
        await session.end("completed")
    assert result.final_output == answer
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert turns(pipeline, key) == [
        (0, "user", "How much is premium?", "complete", 0, 0, False, None),
        (1, "assistant", answer, "complete", 9, 11, False, None),
    ]


async def test_a_streamed_run_cancelled_mid_answer_keeps_the_words_seen_as_a_barged_in_turn(pipeline):
    session_id = f"oa-cut-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    reply = Reply(text="Let me read you the whole terms and conditions now.", hold=3)
    agent = Agent(name="talker", model=FakeModel([reply, Reply(text="Sorry! Yes?", output_tokens=3)]))
    inner = SQLiteSession(session_id)
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, inner, fleet=FLEET, agent_id="talker")
        result = Runner.run_streamed(agent, "Tell me the terms", session=session, hooks=session.hooks)
        deltas = 0
        async for event in session.stream(result):
            if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                deltas += 1
                if deltas == 3:
                    result.cancel()  # the user stops the answer
        await Runner.run(agent, "Stop, a question", session=session, hooks=session.hooks)
        await session.end("completed")
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert turns(pipeline, key) == [
        (0, "user", "Tell me the terms", "complete", 0, 0, False, None),
        (1, "assistant", "Let me read ", "complete", 0, 0, True, None),
        (2, "user", "Stop, a question", "complete", 0, 0, False, None),
        (3, "assistant", "Sorry! Yes?", "complete", 0, 3, False, None),
    ]


class SlowSession(SQLiteSession):
    """An inner session whose saves of assistant items wait for ``release`` (a slow database)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(session_id)
        self.release = asyncio.Event()
        self.saving = asyncio.Event()

    async def add_items(self, items):
        if any(item.get("role") == "assistant" for item in items):
            self.saving.set()
            await self.release.wait()
        await super().add_items(items)


async def test_a_run_cancelled_while_the_session_saves_loses_no_turn(pipeline):
    """openai/openai-agents-python#1658: the caller's cancellation lands inside add_items."""
    session_id = f"oa-cancel-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    agent = Agent(name="bot", model=FakeModel([Reply(text="Here is your answer.", input_tokens=5, output_tokens=4), Reply(text="Next.", output_tokens=1)]))
    inner = SlowSession(session_id)
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, inner, fleet=FLEET, agent_id="bot")
        run = asyncio.create_task(Runner.run(agent, "A question", session=session, hooks=session.hooks))
        await asyncio.wait_for(inner.saving.wait(), TIMEOUT)
        run.cancel()  # e.g. the client disconnected
        with pytest.raises(asyncio.CancelledError):
            await run
        inner.release.set()  # the save the cancellation interrupted goes on
        assert texts(await session.get_items()) == [("user", "A question"), ("assistant", "Here is your answer.")]
        await Runner.run(agent, "Another", session=session, hooks=session.hooks)
        await session.end("completed")
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert turns(pipeline, key) == [
        (0, "user", "A question", "complete", 0, 0, False, None),
        (1, "assistant", "Here is your answer.", "complete", 5, 4, False, None),
        (2, "user", "Another", "complete", 0, 0, False, None),
        (3, "assistant", "Next.", "complete", 0, 1, False, None),
    ]


async def test_open_resumes_and_rebuilds_an_inner_session_that_lost_its_items(pipeline):
    session_id = f"oa-rebuild-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    agent = Agent(name="bot", model=FakeModel([Reply(text="Hello, Ada.", output_tokens=3)]))
    async with recorder_for(pipeline.settings) as recorder:
        first = await TurnlogSession.open(recorder, SQLiteSession(session_id), fleet=FLEET, agent_id="bot")
        await Runner.run(agent, "I am Ada", session=first, hooks=first.hooks)
    # A new process: the in-memory inner session is gone; turnlog has the conversation.
    model = FakeModel([Reply(text="You are Ada.", output_tokens=3)])
    agent = Agent(name="bot", model=model)
    inner = SQLiteSession(session_id)
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, inner, fleet=FLEET, agent_id="bot")
        assert session.recorded.epoch == 1
        assert texts(await inner.get_items()) == [("user", "I am Ada"), ("assistant", "Hello, Ada.")]
        await Runner.run(agent, "Who am I?", session=session, hooks=session.hooks)
        await session.end("completed")
    assert texts(model.calls[0]) == [("user", "I am Ada"), ("assistant", "Hello, Ada."), ("user", "Who am I?")]
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert [t[:4] for t in turns(pipeline, key)] == [
        (0, "user", "I am Ada", "complete"),
        (1, "assistant", "Hello, Ada.", "complete"),
        (2, "user", "Who am I?", "complete"),
        (3, "assistant", "You are Ada.", "complete"),
    ]


def test_an_agent_killed_mid_answer_resumes_with_its_history_rebuilt_from_turnlog(new_pipeline, tmp_path):
    pipeline = new_pipeline(("sequencer", "sink"))
    session_id = f"oa-crash-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    report = kill_mid_answer_then_resume("tests.adapters.openai_agents_script", session_id, pipeline.settings, tmp_path, TIMEOUT)
    asked = [("user", "question 0"), ("assistant", "answer 0"), ("user", "question 1"), ("assistant", "answer 1"), ("user", "question 2")]
    assert [tuple(m) for m in report["rebuilt"]] == asked  # the inner session rebuilt from turnlog
    assert [tuple(m) for m in report["model_saw"]] == [*asked, ("user", "question 3")]
    assert report["epoch"] == 1

    # The tool call answer 1 made before the kill is in the resumed context, where the SDK held it.
    call = [["function_call", "order_status", {"order": "1"}], ["function_call_output", "order 1 ships tomorrow"]]
    with_call = [["user", "question 0"], ["assistant", "answer 0"], ["user", "question 1"], *call, ["assistant", "answer 1"],
                 ["user", "question 2"]]
    assert report["rebuilt_items"] == with_call
    assert report["model_saw_items"] == [*with_call, ["user", "question 3"]]

    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert [t[:6] for t in turns(pipeline, key)] == TURNS_AFTER_A_KILL_MID_ANSWER
    stored_call = {"name": "order_status", "arguments": {"order": "1"}, "result": "order 1 ships tomorrow"}
    assert [(t[0], t[7]) for t in turns(pipeline, key) if t[7]] == [(3, [stored_call])]


async def test_open_appends_what_an_inner_session_lacks_and_leaves_a_different_one_alone(pipeline):
    """A kill between turnlog's record and the inner save leaves the inner session
    one write behind: open appends the rest. An inner session edited on purpose is not touched."""
    session_id = f"oa-behind-{uuid.uuid4().hex[:8]}"
    agent = Agent(name="bot", model=FakeModel([Reply(text="answer 0"), Reply(text="answer 1")]))
    async with recorder_for(pipeline.settings) as recorder:
        first = await TurnlogSession.open(recorder, SQLiteSession(session_id), fleet=FLEET, agent_id="bot")
        await Runner.run(agent, "question 0", session=first, hooks=first.hooks)
        await Runner.run(agent, "question 1", session=first, hooks=first.hooks)
        kept = (await first.inner.get_items())[:2]
    behind = SQLiteSession(session_id)
    await behind.add_items(kept)
    async with recorder_for(pipeline.settings) as recorder:
        await TurnlogSession.open(recorder, behind, fleet=FLEET, agent_id="bot")
    assert texts(await behind.get_items()) == [("user", "question 0"), ("assistant", "answer 0"), ("user", "question 1"), ("assistant", "answer 1")]

    other = SQLiteSession(session_id)
    await other.add_items([{"role": "user", "content": "a conversation of its own"}])
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, other, fleet=FLEET, agent_id="bot")
        await session.end("completed")
    assert texts(await other.get_items()) == [("user", "a conversation of its own")]


async def test_a_popped_item_stays_recorded_and_its_restore_is_not_recorded_twice(pipeline):
    session_id = f"oa-pop-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    agent = Agent(name="bot", model=FakeModel([Reply(text="Paris."), Reply(text="Rome.")]))
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, SQLiteSession(session_id), fleet=FLEET, agent_id="bot")
        await Runner.run(agent, "Capital of France?", session=session, hooks=session.hooks)
        answer = await session.pop_item()
        question = await session.pop_item()
        await session.add_items([question, answer])  # restored, as the Runner's rewind does after a failed retry
        await session.pop_item()
        await session.pop_item()  # the user corrects the question: both go from the context, not from the log
        await Runner.run(agent, "Capital of Italy?", session=session, hooks=session.hooks)
        assert texts(await session.get_items()) == [("user", "Capital of Italy?"), ("assistant", "Rome.")]
        await session.end("completed")
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert [t[:3] for t in turns(pipeline, key)] == [
        (0, "user", "Capital of France?"), (1, "assistant", "Paris."), (2, "user", "Capital of Italy?"), (3, "assistant", "Rome."),
    ]


def test_the_example_imports_without_network_or_api_keys(import_example):
    module = import_example("openai_agents_agent.py")
    assert module.agent.name == "support" and callable(module.main)


def test_which_items_are_turns_and_their_text():
    from turnlog.adapters.openai_agents import _arguments, _message, _missing_from

    assert _message({"role": "user", "content": "hi"}).text == "hi"
    parts = [{"type": "input_text", "text": "look at "}, {"type": "input_image", "image_url": "x"}, {"type": "input_text", "text": "this"}]
    assert (_message({"type": "message", "role": "user", "content": parts}).text) == "look at this"
    refusal = {"type": "message", "role": "assistant", "id": "m1", "content": [{"type": "refusal", "refusal": "I can't."}]}
    assert (_message(refusal).speaker, _message(refusal).text, _message(refusal).item_id) == ("assistant", "I can't.", "m1")
    for item in ({"role": "system", "content": "rules"}, {"type": "function_call", "name": "f", "arguments": "{}"}, {"type": "reasoning", "summary": []}):
        assert _message(item) is None
    assert _arguments('{"a": 1}') == {"a": 1} and _arguments("[1]") == {"value": [1]} and _arguments("{bad") == {"raw": "{bad"}
    u, a = (lambda t: ("user", t)), (lambda t: ("assistant", t))
    assert _missing_from([], [u("1"), a("2")]) == 0  # lost everything: rebuild it all
    assert _missing_from([u("1")], [u("1"), a("2")]) == 1  # one write behind
    assert _missing_from([a("2")], [u("1"), a("2")]) == 2  # a window (get_items' limit) at the end: nothing missing
    assert _missing_from([u("1"), a("edited")], [u("1"), a("2")]) is None


async def test_a_streamed_run_with_a_tool_call_gives_the_answer_every_tokens_and_the_call(pipeline):
    session_id = f"oa-stream-tool-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    model = FakeModel([
        Reply(call=("order_status", '{"order": "7"}'), input_tokens=12, output_tokens=4),
        Reply(text="Order 7 ships tomorrow.", input_tokens=30, output_tokens=6),
    ])
    agent = Agent(name="support", model=model, tools=[order_status])
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, SQLiteSession(session_id), fleet=FLEET, agent_id="support")
        result = Runner.run_streamed(agent, "Order 7?", session=session, hooks=session.hooks)
        async for _ in session.stream(result):
            pass
        await session.end("completed")
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    call = {"name": "order_status", "arguments": {"order": "7"}, "result": "order 7 ships tomorrow"}
    assert turns(pipeline, key) == [
        (0, "user", "Order 7?", "complete", 0, 0, False, None),
        (1, "assistant", "Order 7 ships tomorrow.", "complete", 42, 10, False, [call]),
    ]


async def test_a_chat_completions_model_loses_no_answer_after_a_cut_stream(pipeline):
    """The SDK's OpenAIChatCompletionsModel (as LiteLLM and any-llm models) gives every item
    FAKE_RESPONSES_ID: a cut answer's id is every later answer's id too."""
    session_id = f"oa-fake-id-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    cut = Reply(text="Let me read you the whole terms and conditions now.", input_tokens=4, output_tokens=9, hold=3)
    client = fake_chat_client([cut, Reply(text="Sorry! Yes?", output_tokens=3), Reply(text="It ships today.", output_tokens=4)])
    agent = Agent(name="talker", model=OpenAIChatCompletionsModel("gpt-4o", openai_client=client))
    inner = SQLiteSession(session_id)
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, inner, fleet=FLEET, agent_id="talker")
        result = Runner.run_streamed(agent, "Tell me the terms", session=session, hooks=session.hooks)
        deltas = 0
        async for event in session.stream(result):
            if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                deltas += 1
                if deltas == 3:
                    result.cancel()
        await Runner.run(agent, "Stop, a question", session=session, hooks=session.hooks)
        streamed = Runner.run_streamed(agent, "When does it ship?", session=session, hooks=session.hooks)
        async for _ in session.stream(streamed):
            pass
        await session.end("completed")
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert [t[:7] for t in turns(pipeline, key)] == [
        (0, "user", "Tell me the terms", "complete", 0, 0, False),
        (1, "assistant", "Let me read ", "complete", 0, 0, True),
        (2, "user", "Stop, a question", "complete", 0, 0, False),
        (3, "assistant", "Sorry! Yes?", "complete", 0, 3, False),
        (4, "user", "When does it ship?", "complete", 0, 0, False),
        (5, "assistant", "It ships today.", "complete", 0, 4, False),
    ]
    items = await inner.get_items()
    assert {item.get("id") for item in items if item.get("role") == "assistant"} == {"__fake_id__"}
    held, stored = held_and_stored(pipeline, key, items)
    assert stored == held  # turn by turn: what the SDK holds is what turnlog holds


def test_a_resume_after_a_cut_answer_rebuilds_what_the_inner_session_lacks(new_pipeline, tmp_path):
    """A barged-in turn is never in the inner session: it must not stop the rebuild of a
    persistent inner session left one write behind by a SIGKILL."""
    pipeline = new_pipeline(("sequencer", "sink"))
    session_id = f"oa-cut-crash-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    env = pipeline.settings.as_environment()
    args = ("tests.adapters.openai_agents_cut_script", session_id, str(tmp_path / "inner.db"))
    first = ScriptProcess(args[0], "first", *args[1:], env=env, log_path=tmp_path / "first.log", name="agent-first")
    first.first_with("holding", TIMEOUT)
    first.process.kill()
    second = ScriptProcess(args[0], "second", *args[1:], env=env, log_path=tmp_path / "second.log", name="agent-second")
    done = second.first_with("done", TIMEOUT)
    assert second.process.popen.wait(TIMEOUT) == 0, second.log_tail()

    asked = [("user", "question 0"), ("user", "question 1"), ("assistant", "answer 1"), ("user", "question 2"),
             ("assistant", "answer 2")]
    assert [tuple(m) for m in done["rebuilt"]] == asked  # answer 2 appended from turnlog
    assert [tuple(m) for m in done["model_saw"]] == [*asked, ("user", "question 3")]
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert [t[:7] for t in turns(pipeline, key)] == [
        (0, "user", "question 0", "complete", 0, 0, False),
        (1, "assistant", "answer 0 ", "complete", 0, 0, True),
        (2, "user", "question 1", "complete", 0, 0, False),
        (3, "assistant", "answer 1", "complete", 11, 2, False),
        (4, "user", "question 2", "complete", 0, 0, False),
        (5, "assistant", "answer 2", "complete", 12, 2, False),
        (6, "user", "question 3", "complete", 0, 0, False),
        (7, "assistant", "answer 3", "complete", 13, 2, False),
    ]
    stored = [(t[1], t[2]) for t in turns(pipeline, key) if not t[6]]
    assert stored == [tuple(m) for m in done["held"]]  # turn by turn, after the kill and the resume


class FakeCompactions:
    """``client.responses`` of an ``AsyncOpenAI`` for ``OpenAIResponsesCompactionSession``:
    ``compact`` returns one summary message and keeps each request."""

    def __init__(self) -> None:
        self.requests: list[dict] = []

    async def compact(self, **request):
        self.requests.append(request)
        return SimpleNamespace(output=[{"type": "message", "role": "user", "content": "summary"}], usage=None)


async def test_a_wrapped_compaction_session_still_compacts_and_every_turn_is_recorded(pipeline):
    """The Runner finds run_compaction by getattr (agents/memory/session.py): wrapped, the
    inner compaction session must still be compacted by the Runner itself."""
    from agents.memory import OpenAIResponsesCompactionSession

    session_id = f"oa-compact-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    responses = FakeCompactions()
    inner = OpenAIResponsesCompactionSession(
        session_id, SQLiteSession(session_id), client=SimpleNamespace(responses=responses),
        compaction_mode="input", should_trigger_compaction=lambda context: len(context["session_items"]) >= 4,
    )
    model = FakeModel([Reply(text="answer 0", output_tokens=2), Reply(text="answer 1", output_tokens=2)])
    agent = Agent(name="bot", model=model)
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, inner, fleet=FLEET, agent_id="bot")
        await Runner.run(agent, "question 0", session=session, hooks=session.hooks)
        assert responses.requests == []  # two items: below the inner session's threshold
        await Runner.run(agent, "question 1", session=session, hooks=session.hooks)
        await session.end("completed")
    assert len(responses.requests) == 1
    compacted = [item["content"] for item in responses.requests[0]["input"] if item.get("role") == "user"]
    assert compacted == ["question 0", "question 1"]  # the compaction saw the whole conversation
    assert texts(await inner.get_items()) == [("user", "summary")]  # the SDK's history now: the summary
    assert texts(model.calls[1]) == [("user", "question 0"), ("assistant", "answer 0"), ("user", "question 1")]
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    # turnlog keeps the conversation as it was spoken: what the model was shown, then its answer.
    assert [(t[1], t[2]) for t in turns(pipeline, key)] == [*texts(model.calls[1]), ("assistant", "answer 1")]


def test_a_wrapped_conversations_session_is_one_for_the_sdk():
    """The SDK strips item ids for the Conversations API where isinstance(session,
    OpenAIConversationsSession) (agents/run_internal/session_persistence.py)."""
    from agents.memory import OpenAIConversationsSession

    inner = OpenAIConversationsSession(conversation_id="conv_1", openai_client=SimpleNamespace())
    session = TurnlogSession(inner, SimpleNamespace(turns=()))
    assert isinstance(session, OpenAIConversationsSession) and isinstance(session, TurnlogSession)
    plain = TurnlogSession(SQLiteSession("plain"), SimpleNamespace(turns=()))
    assert not isinstance(plain, OpenAIConversationsSession)


async def test_the_model_call_does_not_wait_for_the_questions_broker_ack(pipeline):
    """The Runner saves the input before the model call: a broker slow to acknowledge the
    question (up to ack_wait_seconds) must not hold the model call."""
    session_id = f"oa-ack-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    model = FakeModel([Reply(text="Hello!", input_tokens=3, output_tokens=1)])
    agent = Agent(name="bot", model=model)
    inner = SQLiteSession(session_id)
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, inner, fleet=FLEET, agent_id="bot")
        record = session.recorded.complete_turn

        async def acknowledged_after_the_model_call(turn_index, speaker, text, **fields):
            if speaker == "user":  # a broker that answers only once the model was called
                await asyncio.wait_for(model.called.wait(), 30)
            await record(turn_index, speaker, text, **fields)

        session.recorded.complete_turn = acknowledged_after_the_model_call
        result = await asyncio.wait_for(Runner.run(agent, "Hi?", session=session, hooks=session.hooks), 30)
        assert result.final_output == "Hello!"
        # The run returned after its answer's save, which waited for the question's write.
        assert texts(await inner.get_items()) == [("user", "Hi?"), ("assistant", "Hello!")]
        await session.end("completed")
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert turns(pipeline, key) == [
        (0, "user", "Hi?", "complete", 0, 0, False, None),
        (1, "assistant", "Hello!", "complete", 3, 1, False, None),
    ]
    held, stored = held_and_stored(pipeline, key, await inner.get_items())
    assert stored == held


def attributes(pipeline, session_id):
    """{turn_index: the stored turn's attributes (its kind...)} of the turns that have any."""
    t = transcript_turns.c
    with pipeline.store.engine.connect() as conn:
        rows = conn.execute(select(t.turn_index, t.attributes).where(t.session_id == session_id)).all()
    return {index: value for index, value in rows if value}


def event_log(pipeline, session_id):
    """The payloads of the session's events in the store's log (session_events), in seq order."""
    e = session_events.c
    with pipeline.store.engine.connect() as conn:
        return list(conn.execute(select(e.payload).where(e.session_id == session_id).order_by(e.seq)).scalars())


BLOCKED_ANSWER = "The admin password is hunter2 and the vault code is 0451."


async def blocked_while_streaming(pipeline, session_id, agent, inner, *, expected, release, run_config=None, answered=None):
    """Stream ``agent``'s answer to a first question until the model holds after four words,
    flush and acknowledge whatever partial text the session holds, then ``release`` the model;
    the run must raise ``expected`` (a tripped guardrail); ``answered`` (an event) is set when the
    answer's response completed. A second question follows with an
    agent without guardrails. Then a new recorder opens the session with an inner session that
    lost its items (a restart), and ends it; returns that inner session's items, as rebuilt."""
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, inner, fleet=FLEET, agent_id="guarded")
        result = Runner.run_streamed(agent, "What is the admin password?", session=session, hooks=session.hooks,
                                     run_config=run_config)
        deltas = 0
        with pytest.raises(expected):
            async for event in session.stream(result, run_config=run_config):
                if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                    deltas += 1
                    if deltas == 4:  # the model holds here: any partial text is flushed and acknowledged
                        await session.recorded.flush_partial()
                        assert await session.recorded.wait_acknowledged(TIMEOUT)
                        release()
                elif event.type == "raw_response_event" and event.data.type == "response.completed" and answered:
                    answered.set()
        assert deltas == len(BLOCKED_ANSWER.split())  # the user was streamed the whole answer
        plain = Agent(name="plain", model=FakeModel([Reply(text="I cannot help with that.", output_tokens=6)]))
        await Runner.run(plain, "Never mind", session=session, hooks=session.hooks)
    lost = SQLiteSession(session_id)
    async with recorder_for(pipeline.settings) as recorder:
        resumed = await TurnlogSession.open(recorder, lost, fleet=FLEET, agent_id="guarded")
        assert resumed.recorded.epoch == 1
        await resumed.end("completed")
    key = session_key(FLEET, session_id)
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{key} finalized")
    return await lost.get_items()


def assert_blocked_and_kept_nowhere(pipeline, key, inner_items, *, tokens):
    """The blocked answer is a turn of kind ``blocked`` with no text; none of its words is in the
    store (its turns, or any event of its log: no partial); the complete turns other than the
    blocked one are what the SDK's session holds."""
    assert turns(pipeline, key) == [
        (0, "user", "What is the admin password?", "complete", 0, 0, False, None),
        (1, "assistant", "", "complete", *tokens, False, None),
        (2, "user", "Never mind", "complete", 0, 0, False, None),
        (3, "assistant", "I cannot help with that.", "complete", 0, 6, False, None),
    ]
    assert attributes(pipeline, key) == {1: {"kind": "blocked"}}
    log = event_log(pipeline, key)
    assert not [p for p in log if "hunter2" in p or "admin password is" in p]
    assert not [p for p in log if '"turn.partial"' in p and '"turn_index":1' in p]
    held, stored = held_and_stored(pipeline, key, inner_items)
    assert held == [("user", "What is the admin password?"), ("user", "Never mind"), ("assistant", "I cannot help with that.")]
    assert [turn for turn in stored if turn != ("assistant", "")] == held


async def test_an_input_guardrail_tripping_while_the_answer_streams_keeps_none_of_its_words(pipeline):
    """An input guardrail running in parallel with the model (the SDK's default) trips after the
    answer streamed: the SDK keeps only the user's message. turnlog keeps a blocked turn with no
    text, and no partial of it ever reaches the spool, the broker or the store."""
    session_id = f"oa-in-guard-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    verdict = asyncio.Event()  # the guardrail decides once the whole answer has streamed

    @input_guardrail
    async def no_credentials(context, agent, user_input):
        await verdict.wait()
        return GuardrailFunctionOutput(output_info={"reason": "credentials"}, tripwire_triggered=True)

    reply = Reply(text=BLOCKED_ANSWER, input_tokens=7, output_tokens=13, hold=4)
    agent = Agent(name="guarded", model=FakeModel([reply]), input_guardrails=[no_credentials])
    inner = SQLiteSession(session_id)

    rebuilt = await blocked_while_streaming(pipeline, session_id, agent, inner, expected=InputGuardrailTripwireTriggered,
                                            release=reply.release.set, answered=verdict)
    items = await inner.get_items()
    assert_blocked_and_kept_nowhere(pipeline, key, items, tokens=(7, 13))
    assert texts(rebuilt) == texts(items)  # a restart's rebuilt context holds what the SDK's own session holds


@pytest.mark.parametrize("where", ["agent", "run_config"])
async def test_an_output_guardrail_tripping_after_a_streamed_answer_keeps_none_of_its_words(pipeline, where):
    """An output guardrail (the agent's, or the RunConfig's given to stream()) trips after the
    answer streamed: the SDK keeps only the user's message. turnlog keeps a blocked turn with no
    text and the answer's tokens, and no partial of it ever reaches the spool, the broker or the store."""
    session_id = f"oa-out-guard-{where}-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)

    @output_guardrail
    async def no_credentials(context, agent, output):
        return GuardrailFunctionOutput(output_info={"reason": "credentials"}, tripwire_triggered="hunter2" in output)

    reply = Reply(text=BLOCKED_ANSWER, input_tokens=7, output_tokens=13, hold=4)
    guardrails = {"output_guardrails": [no_credentials]}
    agent = Agent(name="guarded", model=FakeModel([reply]), **(guardrails if where == "agent" else {}))
    run_config = RunConfig(**guardrails) if where == "run_config" else None
    inner = SQLiteSession(session_id)
    rebuilt = await blocked_while_streaming(pipeline, session_id, agent, inner, expected=OutputGuardrailTripwireTriggered,
                                            release=reply.release.set, run_config=run_config)
    items = await inner.get_items()
    assert_blocked_and_kept_nowhere(pipeline, key, items, tokens=(7, 13))
    assert texts(rebuilt) == texts(items)  # a restart's rebuilt context holds what the SDK's own session holds


async def test_an_answer_a_passing_guardrail_checks_is_recorded_whole_with_its_partial_held_back(pipeline):
    """A guardrail that does not trip: the answer is recorded as the SDK saves it; while the
    guardrail could still block it, no partial text was recorded."""
    session_id = f"oa-guard-pass-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)

    @output_guardrail
    async def no_credentials(context, agent, output):
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered="hunter2" in output)

    answer = "Your plan renews on the first of the month."
    reply = Reply(text=answer, input_tokens=5, output_tokens=9, hold=4)
    agent = Agent(name="guarded", model=FakeModel([reply]), output_guardrails=[no_credentials])
    inner = SQLiteSession(session_id)
    async with recorder_for(pipeline.settings) as recorder:
        session = await TurnlogSession.open(recorder, inner, fleet=FLEET, agent_id="guarded")
        result = Runner.run_streamed(agent, "When does my plan renew?", session=session, hooks=session.hooks)
        deltas = 0
        async for event in session.stream(result):
            if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                deltas += 1
                if deltas == 4:
                    assert session.recorded.open_turns == ()  # held: the guardrail has not run yet
                    reply.release.set()
        await session.end("completed")
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert turns(pipeline, key) == [
        (0, "user", "When does my plan renew?", "complete", 0, 0, False, None),
        (1, "assistant", answer, "complete", 5, 9, False, None),
    ]
    assert attributes(pipeline, key) == {}
    held, stored = held_and_stored(pipeline, key, await inner.get_items())
    assert stored == held


@pytest.mark.parametrize("verdict", ["approve", "reject"])
def test_a_tool_approval_across_a_process_restart_records_the_call_as_the_sdk_holds_it(new_pipeline, tmp_path, verdict):
    """A needs_approval tool stops the run; its RunState is saved (to_string), the process is
    SIGKILLed, and a new process loads the state (from_string), approves or rejects the call and
    runs it again: the SDK's session holds the function call and its output (the tool's, or the
    SDK's rejection message); so does turnlog's answer turn."""
    pipeline = new_pipeline(("sequencer", "sink"))
    session_id = f"oa-approve-{verdict}-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    env = pipeline.settings.as_environment()
    module = "tests.adapters.openai_agents_approval_script"
    args = (session_id, str(tmp_path), verdict)
    first = ScriptProcess(module, "first", *args, env=env, log_path=tmp_path / "first.log", name="agent-first")
    first.first_with("waiting", TIMEOUT)
    first.process.kill()
    second = ScriptProcess(module, "second", *args, env=env, log_path=tmp_path / "second.log", name="agent-second")
    done = second.first_with("done", TIMEOUT)
    assert second.process.popen.wait(TIMEOUT) == 0, second.log_tail()

    held = [tuple(item) for item in done["held"]]
    answer = "Order 42 is refunded." if verdict == "approve" else "I did not refund order 42."
    [output] = [item[1] for item in held if item[0] == "function_call_output"]
    if verdict == "approve":
        assert output == "order 42 refunded"
    else:
        assert output != "order 42 refunded" and "approv" in output.lower()  # the SDK's rejection message
    assert held == [("user", "Refund order 42"), ("function_call", "refund", {"order": "42"}),
                    ("function_call_output", output), ("assistant", answer)]
    assert [tuple(item) for item in done["model_saw"]] == held[:3]
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{session_id} finalized")
    call = {"name": "refund", "arguments": {"order": "42"}, "result": output}
    assert turns(pipeline, key) == [
        (0, "user", "Refund order 42", "complete", 0, 0, False, None),
        # The tool-calling response's tokens (9, 3) were pending in the killed process: lost.
        (1, "assistant", answer, "complete", 20, 5, False, [call]),
    ]
