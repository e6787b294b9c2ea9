"""The LiveKit Agents adapter, driven by LiveKit's own machinery (a real
``AgentSession``, text-only, with a scripted LLM), recorded into the real broker
and Postgres; and an agent process SIGKILLed mid-reply and restarted."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
import time
import uuid
from pathlib import Path

import pytest

from turnlog.resume_barrier import resume_source_for

from tests.support import recorder_for, require_extra

require_extra("livekit.agents", "livekit")

from livekit.agents import Agent, AgentSession, APIConnectOptions, ChatContext, UserInputTranscribedEvent, function_tool
from livekit.agents.ipc.job_proc_lazy_main import _JobProc
from livekit.agents.metrics.usage import LLMModelUsage
from livekit.agents.testing import fake_job_context
from livekit.agents.voice.agent_session import SessionConnectOptions
from sqlalchemy import select

from turnlog.adapters.livekit import chat_context_from_turns, record_session
from turnlog.ops.audit import fold_events
from turnlog.producers import StoredTurn
from turnlog.schemas import TurnPartial, decode_event
from turnlog.schemas.session_keys import session_key
from turnlog.sinks.tables import session_events, sessions, transcript_turns

from tests.adapters.livekit_fakes import (
    CapturedText,
    Gatekeeper,
    LateTranscriptRealtime,
    Reply,
    ScriptedLLM,
    ScriptedUser,
    SilentTTS,
    conversation_items,
    run_job,
    shut_down_job,
    voice_outputs,
)
from tests.adapters.stored import FLEET
from tests.progress import ScriptProcess
from tests.support import wait_until

TIMEOUT = 90
ROOT = Path(__file__).resolve().parents[2]
PLANS = "Our plans are simple. " + " ".join(f"plan{i}" for i in range(800))  # ~45 s at 5 chars / 50 ms
REPLIES = {
    "Hello": Reply("Hi! How can I help you today?", input_tokens=12, output_tokens=9),
    "I'd like to know about your plans": Reply(PLANS, input_tokens=40, output_tokens=300, chunk_chars=5, chunk_seconds=0.05),
    "wait, how much is it?": Reply("It is 10 dollars a month.", input_tokens=55, output_tokens=8),
}


# -- store reads -------------------------------------------------------------------------
def turns_of(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        return conn.execute(
            select(transcript_turns).where(transcript_turns.c.session_id == session_id).order_by(transcript_turns.c.turn_index)
        ).mappings().all()


def session_row(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        return conn.execute(select(sessions).where(sessions.c.id == session_id)).mappings().first()


def logged_events(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        payloads = conn.execute(
            select(session_events.c.payload).where(session_events.c.session_id == session_id).order_by(session_events.c.seq)
        ).scalars().all()
    return payloads, [decode_event(p) for p in payloads]


def stored_turn(pipeline, key, index):
    return next((t for t in turns_of(pipeline, key) if t["turn_index"] == index), None)


def finalized(pipeline, key):
    row = session_row(pipeline, key)
    return row if row is not None and row["status"] == "finalized" else None


def conversation(rows):
    """Stored turns as (index, speaker, text, status, barged_in, input_tokens, output_tokens)."""
    return [
        (t["turn_index"], t["speaker"], t["text"], t["status"], t["barged_in"], t["input_tokens"], t["output_tokens"])
        for t in rows
    ]


def messages(chat_ctx):
    return [(m.role, m.text_content, m.interrupted) for m in chat_ctx.messages() if m.role in ("user", "assistant")]


async def eventually(probe, *, what, timeout=TIMEOUT):
    """``wait_until`` for async tests: the probe runs in a thread, the event loop (LiveKit's) keeps running."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(probe)
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.1)


def new_session(llm, **options):
    return AgentSession(llm=llm, vad=None, user_away_timeout=None, **options)


# -- the rebuilt context (no services) ----------------------------------------------------
def stored(index, speaker, text, status="complete", barged_in=False, second=0):
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=second)
    return StoredTurn(index, speaker, text, status, start, None, 0, 0, None, barged_in)


def test_the_context_rebuilt_from_stored_turns_keeps_their_order_and_marks_cut_turns_interrupted():
    base = ChatContext.empty()
    kept = base.add_message(role="system", content="Be brief.")
    turns = [
        stored(3, "user", "wait, what", status="interrupted", second=5),
        stored(0, "user", "hello", second=1),
        stored(1, "assistant", "Hi, our plans", barged_in=True, second=3),
        stored(2, "operator", "a note", second=4),  # not a LiveKit role: left out
        stored(4, "assistant", "", status="partial", second=6),  # no text: left out
        stored(5, "assistant", "Of course,", status="partial", second=2),  # started earlier, yet after turn 3
    ]
    context = chat_context_from_turns(turns, base=base)
    assert [(m.id, m.role, m.text_content, m.interrupted) for m in context.messages() if m.role != "system"] == [
        ("turnlog_0", "user", "hello", False),
        ("turnlog_1", "assistant", "Hi, our plans", True),
        ("turnlog_3", "user", "wait, what", True),
        ("turnlog_5", "assistant", "Of course,", True),
    ]
    stamps = [m.created_at for m in context.messages() if m.id.startswith("turnlog_")]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert kept in context.items and len(base.items) == 1  # base is copied, not changed


def test_the_example_agent_imports_without_network_and_registers_its_entrypoint():
    import runpy

    from livekit.agents import AgentServer

    example = runpy.run_path(str(ROOT / "examples" / "livekit_agent.py"), run_name="livekit_example")
    assert isinstance(example["server"], AgentServer) and asyncio.iscoroutinefunction(example["entrypoint"])


# -- in-process --------------------------------------------------------------------------
async def test_a_conversation_with_interim_transcripts_and_a_barge_in_is_stored_as_livekit_saw_it(pipeline):
    session_id = f"lk-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    session, agent = new_session(ScriptedLLM(REPLIES)), Agent(instructions="You are a test agent.")
    room_text = session.output.transcription = CapturedText()  # as RoomIO's transcription output would be
    recording = await record_session(
        session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit", settings=pipeline.settings,
        resume_source=resume_source_for(pipeline.settings),
    )
    assert not recording.resumed and recording.recorded.epoch == 0
    await session.start(agent)
    assert session.output.transcription is room_text  # watched, not replaced
    try:
        await session.run(user_input="Hello")

        # The user speaks: interim segments, a final one, then the next segment's interims.
        for text, final in (("I'd", False), ("I'd like to know", True), ("about", False), ("about your", False)):
            session.emit("user_input_transcribed", UserInputTranscribedEvent(transcript=text, is_final=final))
        await eventually(
            lambda: (t := stored_turn(pipeline, key, 2)) and (t["speaker"], t["text"], t["status"])
            == ("user", "I'd like to know about your", "partial"),
            what="the user's partial turn (final segment + interim) in the store",
        )
        run = session.run(user_input="I'd like to know about your plans")

        # The agent's reply is streamed slowly; its partial text reaches the store while it speaks.
        await eventually(
            lambda: (t := stored_turn(pipeline, key, 3)) and t["status"] == "partial" and len(t["text"]) > 30,
            what="the agent's partial reply in the store",
        )
        # Barge-in: the user starts talking, and the agent is interrupted.
        session.emit("user_input_transcribed", UserInputTranscribedEvent(transcript="wait", is_final=False))
        await session.interrupt()
        await run
        await session.run(user_input="wait, how much is it?")
    finally:
        await session.aclose()  # close reason user_initiated: the session ends in turnlog
    assert await recording.wait_closed(TIMEOUT)
    assert recording.failures == 0

    seen = messages(session.history)
    row = await eventually(lambda: finalized(pipeline, key), what="the session finalized")
    stored = conversation(turns_of(pipeline, key))

    # LiveKit's own history: the barged-in reply holds what was spoken before the interruption.
    spoken = seen[3][1]
    assert seen == [
        ("user", "Hello", False),
        ("assistant", "Hi! How can I help you today?", False),
        ("user", "I'd like to know about your plans", False),
        ("assistant", spoken, True),
        ("user", "wait, how much is it?", False),
        ("assistant", "It is 10 dollars a month.", False),
    ]
    assert 30 < len(spoken) < len(PLANS) and PLANS.startswith(spoken)
    # Everything still reached the output the adapter wraps, segment by segment.
    assert room_text.segments == ["Hi! How can I help you today?", spoken, "It is 10 dollars a month."]
    # The store holds exactly that conversation: turns, speakers, text, order, the barge-in, tokens.
    assert stored == [
        (0, "user", "Hello", "complete", False, 0, 0),
        (1, "assistant", "Hi! How can I help you today?", "complete", False, 12, 9),
        (2, "user", "I'd like to know about your plans", "complete", False, 0, 0),
        (3, "assistant", spoken, "complete", True, 40, 300),
        (4, "user", "wait, how much is it?", "complete", False, 0, 0),
        (5, "assistant", "It is 10 dollars a month.", "complete", False, 55, 8),
    ]
    assert [(i, speaker, text, barged) for i, speaker, text, _, barged, _, _ in stored] == [
        (i, role, text, interrupted) for i, (role, text, interrupted) in enumerate(seen)
    ]
    assert (row["turn_count"], row["interrupted_turn_count"], row["input_tokens"], row["output_tokens"]) == (6, 0, 107, 317)
    assert row["end_seq"] == row["last_seq"] and row["epoch"] == 0

    # The log holds the partials the adapter recorded on the way: the user's interim text,
    # the barge-in's user turn opened by an interim, and the agent's text growing.
    payloads, events = logged_events(pipeline, key)
    partials = [(e.turn_index, e.speaker, e.text) for e in events if isinstance(e, TurnPartial)]
    assert (2, "user", "I'd like to know about your") in partials
    agent_partials = [text for index, _, text in partials if index == 3]
    assert agent_partials and all(PLANS.startswith(text) for text in agent_partials)
    assert fold_events(payloads).seqs == list(range(len(payloads)))


EVERYTHING = "Let me explain. " + " ".join(f"point{i}" for i in range(120))  # ~17 s of audio at 20 ms a character


async def test_on_the_voice_path_a_barged_in_reply_is_stored_with_the_words_heard_not_the_words_generated(pipeline):
    session_id = f"lk-voice-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)
    replies = {"Hello": REPLIES["Hello"], "Tell me everything": Reply(EVERYTHING, input_tokens=20, output_tokens=150)}
    session = AgentSession(llm=ScriptedLLM(replies), tts=SilentTTS(), vad=None, user_away_timeout=None)
    room_text = voice_outputs(session)  # audio and text outputs as RoomIO sets them: text released as the audio plays
    agent = Agent(instructions="You are a test agent.")
    recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit-voice", settings=pipeline.settings, resume_source=resume_source_for(pipeline.settings))
    await session.start(agent)
    try:
        await session.run(user_input="Hello")
        run = session.run(user_input="Tell me everything")
        await eventually(lambda: len(room_text.current) > 40, what="some of the reply heard", timeout=60)
        session.emit("user_input_transcribed", UserInputTranscribedEvent(transcript="stop", is_final=False))
        await session.interrupt()
        await run
        await session.run(user_input="Hello")
    finally:
        await session.aclose()
    assert await recording.wait_closed(TIMEOUT) and recording.failures == 0

    seen = messages(session.history)
    heard = seen[3][1]
    assert seen[3][2] is True and 20 < len(heard) < len(EVERYTHING) and EVERYTHING.startswith(heard)
    await eventually(lambda: finalized(pipeline, key), what="the session finalized")
    stored = conversation(turns_of(pipeline, key))
    assert [(i, speaker, text, barged) for i, speaker, text, _, barged, _, _ in stored] == [
        (i, role, text, interrupted) for i, (role, text, interrupted) in enumerate(seen)
    ]
    assert stored[3] == (3, "assistant", heard, "complete", True, 20, 150)
    # The room was sent that reply's text as it played, and no further (the synchronizer
    # may have released the word being spoken when the interruption came).
    [sent] = [segment for segment in room_text.segments if segment.startswith("Let me")]
    assert sent.startswith(heard) and len(sent) < len(EVERYTHING) and EVERYTHING.startswith(sent)
    # The partials were the text as it played (what the room was sent), never the text
    # generated ahead of the audio (the scripted LLM generated all of it at once).
    _, events = logged_events(pipeline, key)
    partials = [e.text for e in events if isinstance(e, TurnPartial) and e.turn_index == 3]
    assert partials and all(sent.startswith(text) for text in partials)


async def _recorded_and_greeted(pipeline, session, agent, session_id):
    """In a job's entrypoint: record ``session``, start it, and have the user say "Hello"."""
    recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit",
                                     settings=pipeline.settings, resume_source=resume_source_for(pipeline.settings))
    await session.start(agent)
    await session.run(user_input="Hello")
    return recording


@pytest.mark.parametrize("close", ["drain timeout", "ctx.shutdown", "job crashed", "error", "drain timeout, wait_for2"])
async def test_a_session_livekit_closes_for_job_shutdown_or_error_stays_resumable_and_resumes_its_context(
    pipeline, close, monkeypatch
):
    if close.endswith(", wait_for2"):
        # Pipecat replaces asyncio.wait_for with wait_for2's on Python < 3.12 when it is imported:
        # LiveKit's job shutdown then closes the session through that one.
        wait_for2 = pytest.importorskip("wait_for2")
        monkeypatch.setattr(asyncio, "wait_for", wait_for2.wait_for)
        close = close.removesuffix(", wait_for2")
    session_id = f"lk-{close.replace(' ', '-').replace('.', '-')}-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)
    llm = ScriptedLLM({**REPLIES, "break": Reply(fail=True)})
    options = {"conn_options": SessionConnectOptions(llm_conn_options=APIConnectOptions(max_retry=0), max_unrecoverable_errors=0)}
    session, agent = new_session(llm, **options), Agent(instructions="You are a test agent.")
    recordings = []

    async def entrypoint(ctx):
        recordings.append(await _recorded_and_greeted(pipeline, session, agent, session_id))
        if close == "error":
            session.generate_reply(user_input="break")  # an unrecoverable LLM error closes the session
            assert await recordings[0].wait_closed(TIMEOUT)

    if close == "error" or not hasattr(_JobProc, "_shutdown_job"):
        # A job run by LiveKit's job process; its shutdown closes the session with
        # session.aclose() (reason user_initiated), then runs the shutdown callbacks.
        await run_job(entrypoint, shutdown="ctx.shutdown" if close == "error" else close)
    else:
        # LiveKit's shutdown sequence (_JobProc._shutdown_job: session.aclose(), then the
        # shutdown callbacks) on a job whose entrypoint ran in this task.
        with fake_job_context() as job:
            await entrypoint(job)
            reason = {"drain timeout": "draining timed out", "ctx.shutdown": "user requested"}.get(close, close)
            await shut_down_job(job, reason=reason, user_initiated=close == "ctx.shutdown")
    [recording] = recordings
    assert recording.closed
    assert recording.failures == 0
    seen = messages(session.history)  # what LiveKit committed before it closed the session
    assert seen[:2] == [("user", "Hello", False), ("assistant", "Hi! How can I help you today?", False)]

    # Not ended: the session stays active in turnlog, with exactly that conversation.
    await eventually(
        lambda: [(t["turn_index"], t["speaker"], t["text"], t["status"]) for t in turns_of(pipeline, key)]
        == [(i, role, text, "complete") for i, (role, text, _) in enumerate(seen)],
        what="the conversation LiveKit saw, stored",
    )
    assert session_row(pipeline, key)["status"] == "active"

    # The next job resumes it (through a recorder of its own): LiveKit's ChatContext is rebuilt from turnlog.
    llm = ScriptedLLM(REPLIES)
    session, agent = new_session(llm), Agent(instructions="You are a test agent.")
    async with recorder_for(pipeline.settings) as recorder:
        recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit", recorder=recorder)
        assert recording.resumed and recording.recorded.epoch == 1
        rebuilt = seen
        assert messages(agent.chat_ctx) == rebuilt and messages(session.history) == rebuilt
        await session.start(agent)
        await session.run(user_input="wait, how much is it?")
        await session.say("Goodbye!", add_to_chat_ctx=False)  # spoken, but kept out of LiveKit's history
        await session.aclose()
        assert await recording.wait_closed(TIMEOUT)
        assert recording.failures == 0
    assert [m for m in llm.contexts[-1] if m[0] in ("user", "assistant")] == [*rebuilt, ("user", "wait, how much is it?", False)]

    await eventually(lambda: finalized(pipeline, key), what="the resumed session finalized")
    stored = [(t["turn_index"], t["speaker"], t["text"], t["status"]) for t in turns_of(pipeline, key)]
    n = len(rebuilt)
    assert stored == [
        *[(i, role, text, "complete") for i, (role, text, _) in enumerate(rebuilt)],
        (n, "user", "wait, how much is it?", "complete"),
        (n + 1, "assistant", "It is 10 dollars a month.", "complete"),
        (n + 2, "assistant", "Goodbye!", "complete"),
    ]


class _PricingAgent(Agent):
    def __init__(self) -> None:
        super().__init__(instructions="You are a test agent.")

    @function_tool
    async def lookup_price(self, plan: str) -> str:
        """Look up the monthly price of a plan."""
        return f"The {plan} plan is 10 dollars a month."


PRICING = {**REPLIES, "How much is the basic plan?": Reply("It is 10 dollars a month.", input_tokens=20, output_tokens=7,
                                                          tool_call=("lookup_price", '{"plan": "basic"}'))}


async def test_a_tool_livekit_ran_is_recorded_with_its_reply_and_a_resume_puts_it_back_in_the_context(pipeline):
    session_id = f"lk-tool-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)
    session, agent = new_session(ScriptedLLM(PRICING)), _PricingAgent()
    recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit",
                                     settings=pipeline.settings, resume_source=resume_source_for(pipeline.settings))
    await session.start(agent)
    try:
        await session.run(user_input="How much is the basic plan?")
        await recording.wait_recorded()
    finally:
        await recording.aclose()  # stops recording; the session stays resumable
        await session.aclose()
    assert recording.failures == 0
    seen = conversation_items(session.history.items)
    assert seen == [
        ("message", "user", "How much is the basic plan?"),
        ("function_call", "lookup_price", {"plan": "basic"}),
        ("function_call_output", "lookup_price", "The basic plan is 10 dollars a month.", False),
        ("message", "assistant", "It is 10 dollars a month."),
    ]
    reply = await eventually(lambda: (t := stored_turn(pipeline, key, 1)) and t["status"] == "complete" and t,
                             what="the reply in the store")
    assert reply["tool_calls"] == [{"name": "lookup_price", "arguments": {"plan": "basic"},
                                    "result": "The basic plan is 10 dollars a month."}]

    # The next job resumes: the agent's context, and what the model is given next, hold the tool as LiveKit had it.
    llm = ScriptedLLM(PRICING)
    session, agent = new_session(llm), _PricingAgent()
    recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit",
                                     settings=pipeline.settings, resume_source=resume_source_for(pipeline.settings))
    assert recording.resumed
    assert conversation_items(agent.chat_ctx.items) == seen
    assert conversation_items(session.history.items) == seen
    await session.start(agent)
    try:
        await session.run(user_input="wait, how much is it?")
    finally:
        await session.aclose()
    assert await recording.wait_closed(TIMEOUT) and recording.failures == 0
    assert conversation_items(llm.items[-1]) == [*seen, ("message", "user", "wait, how much is it?")]


class _EndsTheCallAgent(Agent):
    """Ends the call from a tool as LiveKit's examples do: the session closed in a task of its own."""

    def __init__(self) -> None:
        super().__init__(instructions="You are a test agent.")
        self.closing: asyncio.Task[None] | None = None

    @function_tool
    async def end_call(self) -> str:
        """End the call."""
        self.closing = asyncio.create_task(self.session.aclose())
        return "The call is over."


@pytest.mark.parametrize("close", ["create_task from a tool", "wait_for in the entrypoint", "await in the entrypoint"])
async def test_a_session_the_app_closes_in_a_task_of_its_own_inside_a_job_is_ended(pipeline, close):
    session_id = f"lk-app-close-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)
    llm = ScriptedLLM({**REPLIES, "That's all, bye": Reply("Goodbye!", tool_call=("end_call", "{}"))})
    session, agent = new_session(llm), _EndsTheCallAgent()
    recordings = []

    async def entrypoint(ctx):
        recordings.append(await _recorded_and_greeted(pipeline, session, agent, session_id))
        if close == "create_task from a tool":
            with contextlib.suppress(RuntimeError):  # the session may close before the run's last step
                await session.run(user_input="That's all, bye")
            await eventually(lambda: agent.closing is not None, what="the tool called")
        elif close == "wait_for in the entrypoint":
            await asyncio.wait_for(session.aclose(), 5)  # Python 3.11 runs the close in a task of its own
        else:
            await session.aclose()  # in the entrypoint's task, which LiveKit's job task keeps a reference to
        assert await recordings[0].wait_closed(TIMEOUT)

    await run_job(entrypoint, shutdown="ctx.shutdown")  # the job shuts down after the app closed its session
    [recording] = recordings
    assert recording.failures == 0
    if close == "create_task from a tool":
        assert [call.name for call in _function_calls(session)] == ["end_call"]  # LiveKit ran the tool
    # The app's close ends the session in turnlog: it is finalized, not left resumable.
    row = await eventually(lambda: finalized(pipeline, key), what="the session finalized")
    assert row["end_reason"] == "user_initiated"


def _function_calls(session):
    return [item for item in session.history.items if item.type == "function_call"]


async def test_with_a_realtime_model_that_transcribes_the_user_after_its_reply_the_question_is_stored_before_the_answer(pipeline):
    session_id = f"lk-realtime-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)
    realtime = LateTranscriptRealtime()
    session, agent = AgentSession(llm=realtime.model, vad=None, user_away_timeout=None), Agent(instructions="You are a test agent.")
    recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit-realtime", settings=pipeline.settings, resume_source=resume_source_for(pipeline.settings))
    await session.start(agent)
    try:
        await realtime.user_turn("What time is it?", "It is noon.", item_id="user-1")
        await eventually(lambda: len(messages(session.history)) == 2, what="the first exchange committed", timeout=30)
        await realtime.user_turn("Thanks", "You're welcome.", item_id="user-2")
        await eventually(lambda: len(messages(session.history)) == 4, what="the second exchange committed", timeout=30)
    finally:
        await session.aclose()
    assert await recording.wait_closed(TIMEOUT) and recording.failures == 0

    seen = messages(session.history)  # LiveKit puts the late transcript before the reply it prompted
    assert [role for role, _, _ in seen] == ["user", "assistant", "user", "assistant"]
    await eventually(lambda: finalized(pipeline, key), what="the session finalized")
    stored = conversation(turns_of(pipeline, key))
    assert [(i, speaker, text, barged) for i, speaker, text, _, barged, _, _ in stored] == [
        (i, role, text, interrupted) for i, (role, text, interrupted) in enumerate(seen)
    ]
    # A resume rebuilds the context in that order too.
    rebuilt = chat_context_from_turns([stored_turn_of(row) for row in turns_of(pipeline, key)])
    assert messages(rebuilt) == seen


async def user_says(user, session, text):
    """The user says ``text`` as LiveKit hears it: speech begins (VAD), an interim and a final
    transcript (STT), speech ends; LiveKit then ends the user's turn (VAD turn detection)."""
    user.starts_speaking()
    user.keeps_speaking()
    user.is_heard(text.split()[0], final=False)
    user.is_heard(text)
    user.stops_speaking()
    await eventually(lambda: session.user_state == "listening", what="the user heard to stop speaking", timeout=30)


async def slowly(text, *, chars=6, seconds=0.05):
    for start in range(0, len(text), chars):
        await asyncio.sleep(seconds)
        yield text[start : start + chars]


NOTICE = "Please listen carefully, our menu options have changed. " + " ".join(f"option{i}" for i in range(40))


@pytest.mark.parametrize("preemptive", [False, True], ids=["reply-at-end-of-turn", "preemptive-generation"])
async def test_user_turns_livekit_drops_leave_nothing_in_the_next_turn_and_are_stored_as_livekit_holds_them(pipeline, preemptive):
    """Through LiveKit's own audio recognition (VAD + STT, VAD turn detection): a turn
    ``on_user_turn_completed`` stops (``StopResponse``), a user who speaks and is not
    transcribed, and speech while an uninterruptible reply plays. LiveKit keeps none of
    them in its history; its next user turn holds only the next words. With preemptive
    generation (LiveKit's default), the reply LiveKit generated for the stopped turn is
    never scheduled, and its tokens are counted on a later assistant turn."""
    session_id = f"lk-dropped-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)
    user = ScriptedUser()
    llm = ScriptedLLM({
        "Hello": REPLIES["Hello"],
        "never mind": Reply("Okay.", input_tokens=5, output_tokens=1),  # generated preemptively only
        "What time is it?": Reply("It is noon.", input_tokens=30, output_tokens=4),
    })
    options = user.session_options()
    options["turn_handling"]["interruption"]["discard_audio_if_uninterruptible"] = False  # the STT hears it all
    options["turn_handling"]["preemptive_generation"] = {"enabled": preemptive}
    session, agent = AgentSession(llm=llm, **options), Gatekeeper(instructions="You are a test agent.")
    user.attach(session)
    recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit-dropped",
                                     settings=pipeline.settings, resume_source=resume_source_for(pipeline.settings))
    await session.start(agent)
    try:
        await eventually(lambda: user.listening, what="LiveKit listening to the user", timeout=30)
        await user_says(user, session, "Hello")
        await eventually(lambda: len(messages(session.history)) == 2, what="the first exchange", timeout=30)

        # StopResponse: LiveKit ends the turn and commits nothing.
        await user_says(user, session, "never mind")
        await eventually(lambda: (t := stored_turn(pipeline, key, 2)) and t["status"] == "complete",
                         what="the stopped turn completed")

        # Speech LiveKit does not transcribe, then the agent speaks.
        user.starts_speaking()
        await eventually(lambda: session.user_state == "speaking", what="the user speaking", timeout=30)
        user.stops_speaking()
        await eventually(lambda: session.user_state == "listening", what="the user silent", timeout=30)
        await session.say("Are you still there?")

        # Speech while an uninterruptible reply plays: LiveKit skips the reply to it.
        notice = session.say(slowly(NOTICE), allow_interruptions=False)
        await eventually(lambda: (t := stored_turn(pipeline, key, 4)) and len(t["text"]) > 20,
                         what="the notice playing")
        await user_says(user, session, "wait, stop")
        await eventually(lambda: (t := stored_turn(pipeline, key, 5)) and t["status"] == "complete",
                         what="the skipped turn completed")
        assert not notice.interrupted
        await notice

        await user_says(user, session, "What time is it?")
        await eventually(lambda: len(messages(session.history)) == 6, what="the last exchange", timeout=30)
    finally:
        await session.aclose()
    assert await recording.wait_closed(TIMEOUT) and recording.failures == 0

    seen = messages(session.history)
    assert seen == [
        ("user", "Hello", False),
        ("assistant", "Hi! How can I help you today?", False),
        ("assistant", "Are you still there?", False),
        ("assistant", NOTICE, False),
        ("user", "What time is it?", False),
        ("assistant", "It is noon.", False),
    ]
    row = await eventually(lambda: finalized(pipeline, key), what="the session finalized")
    stored = conversation(turns_of(pipeline, key))
    # The turns LiveKit dropped are completed with no text; the untranscribed speech took no turn.
    assert [turn[:5] for turn in stored] == [
        (0, "user", "Hello", "complete", False),
        (1, "assistant", "Hi! How can I help you today?", "complete", False),
        (2, "user", "", "complete", False),
        (3, "assistant", "Are you still there?", "complete", False),
        (4, "assistant", NOTICE, "complete", False),
        (5, "user", "", "complete", False),
        (6, "user", "What time is it?", "complete", False),
        (7, "assistant", "It is noon.", "complete", False),
    ]
    tokens = [tuple(turn[5:]) for turn in stored]
    assert tokens[:2] == [(0, 0), (12, 9)] and tokens[7][0] >= 30
    if not preemptive:
        assert tokens == [(0, 0), (12, 9), (0, 0), (0, 0), (0, 0), (0, 0), (0, 0), (30, 4)]
    # Every token LiveKit counted is stored once.
    [usage] = [u for u in session.usage.model_usage if isinstance(u, LLMModelUsage)]
    assert (row["input_tokens"], row["output_tokens"]) == (usage.input_tokens, usage.output_tokens)
    assert (usage.input_tokens, usage.output_tokens) == ((12 + 5 + 30, 9 + 1 + 4) if preemptive else (42, 13))
    # Turn by turn, the turns with text are LiveKit's history.
    assert [(speaker, text, barged) for _, speaker, text, _, barged, _, _ in stored if text] == seen
    # No partial of a later turn began with a dropped turn's words.
    _, events = logged_events(pipeline, key)
    partials = {(e.turn_index, e.text) for e in events if isinstance(e, TurnPartial) and e.speaker == "user"}
    assert {text for index, text in partials if index == 2} <= {"never", "never mind"}
    assert {text for index, text in partials if index == 5} <= {"wait,", "wait, stop"}
    assert {text for index, text in partials if index == 6} <= {"What", "What time is it?"}
    assert {index for index, _ in partials} <= {0, 2, 5, 6}
    # A resume gives the agent LiveKit's conversation.
    rebuilt = chat_context_from_turns([stored_turn_of(row) for row in turns_of(pipeline, key)])
    assert messages(rebuilt) == seen


async def test_an_llm_calls_tokens_go_to_the_turn_of_the_speech_livekit_made_it_for(pipeline):
    """A reply generated while another speech plays: LiveKit runs its LLM call at once
    (``_pipeline_reply_task`` starts inference before the speech is scheduled) and tags
    the call's metrics with the reply's speech (``LLMMetrics.speech_id``). Its tokens go to
    the reply's turn, not to the speech that was playing when they were reported."""
    session_id = f"lk-tokens-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)
    session, agent = new_session(ScriptedLLM(REPLIES)), Agent(instructions="You are a test agent.")
    room_text = session.output.transcription = CapturedText()
    reported = []
    session.on("session_usage_updated", lambda ev: reported.append(session.current_speech))
    recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit-tokens",
                                     settings=pipeline.settings, resume_source=resume_source_for(pipeline.settings))
    await session.start(agent)
    try:
        await session.run(user_input="Hello")
        reported.clear()
        notice = session.say(slowly(NOTICE))
        await eventually(lambda: len(room_text.current) > 20, what="the notice playing")
        reply = session.generate_reply(instructions="Greet the user again.")  # answers "Hello" again
        await eventually(lambda: reported, what="the reply's tokens reported", timeout=30)
        assert reported[0] is notice and not notice.done()  # reported while the notice played
        await notice
        await reply
    finally:
        await session.aclose()
    assert await recording.wait_closed(TIMEOUT) and recording.failures == 0

    seen = messages(session.history)
    hello = ("assistant", "Hi! How can I help you today?", False)
    assert seen == [("user", "Hello", False), hello, ("assistant", NOTICE, False), hello]
    await eventually(lambda: finalized(pipeline, key), what="the session finalized")
    stored = conversation(turns_of(pipeline, key))
    assert [(speaker, text, barged) for _, speaker, text, _, barged, _, _ in stored] == seen
    assert [(index, tokens) for index, _, _, _, _, *tokens in stored] == [(0, [0, 0]), (1, [12, 9]), (2, [0, 0]), (3, [12, 9])]


async def test_the_turn_spans_carry_livekits_speech_id_and_the_jobs_room_and_job_ids(pipeline, recorder_spans,
                                                                                    monkeypatch):
    """With turnlog's tracing on, the span of an assistant turn carries the ``lk.speech_id``
    of the speech that spoke it, and every turn of a job's session the job's ``lk.room_sid``,
    ``lk.job_id`` and ``gen_ai.conversation.id``: the values LiveKit's own ``agent_turn`` and
    ``agent_session`` spans carry under the same keys, so a join is an equality."""
    from livekit.agents import __version__ as livekit_version
    from livekit.agents.telemetry import traces as livekit_traces
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    livekit_spans = InMemorySpanExporter()  # LiveKit's own spans, kept apart from turnlog's
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(livekit_spans))
    # LiveKit's tracer, swapped as its set_tracer_provider does (undone after the test), where
    # the release has that tracer (1.8.9's _DynamicTracer)
    swappable = all(hasattr(livekit_traces.tracer, name) for name in ("_tracer_provider", "_tracer"))
    if swappable:
        monkeypatch.setattr(livekit_traces.tracer, "_tracer_provider", provider)
        monkeypatch.setattr(livekit_traces.tracer, "_tracer", provider.get_tracer("livekit-agents"))
    session_id = f"lk-trace-{uuid.uuid4().hex[:6]}"
    session, agent = new_session(ScriptedLLM(REPLIES)), Agent(instructions="You are a test agent.")
    speeches = []
    session.on("speech_created", lambda ev: speeches.append(ev.speech_handle.id))
    with fake_job_context() as job:
        recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit-trace",
                                         settings=pipeline.settings, resume_source=resume_source_for(pipeline.settings))
        await session.start(agent)
        await session.run(user_input="Hello")
        await session.say("Goodbye!", add_to_chat_ctx=False)  # completed at its speech's end, not by a message
        await session.aclose()
        assert await recording.wait_closed(TIMEOUT) and recording.failures == 0
    room_sid, job_id = job.job.room.sid, job.job.id

    spans = recorder_spans.turns(session_key(FLEET, session_id))
    assert sorted(spans) == [0, 1, 2]
    assert room_sid and job_id
    ids = {"lk.room_sid": room_sid, "lk.job_id": job_id, "gen_ai.conversation.id": room_sid}
    assert [{key: spans[index].get(key) for key in ids} for index in (0, 1, 2)] == [ids] * 3
    assert "lk.speech_id" not in spans[0]  # the user's turn is no speech of LiveKit's
    assert len(speeches) == 2 and [spans[1]["lk.speech_id"], spans[2]["lk.speech_id"]] == speeches

    provider.shutdown()
    if not swappable:
        return
    theirs = livekit_spans.get_finished_spans()
    agent_turns = sorted((span for span in theirs if span.name == "agent_turn"), key=lambda span: span.start_time)
    assert [span.attributes.get("lk.speech_id") for span in agent_turns] == speeches
    # The job's ids where LiveKit's spans carry them (1.8.9 does; an older release may not).
    [agent_session] = [span for span in theirs if span.name == "agent_session"]
    carried = [(key, span.attributes[key]) for span in (*agent_turns, agent_session) for key in ids
               if key in span.attributes]
    assert all(value == ids[key] for key, value in carried)
    if tuple(int(part) for part in re.findall(r"\d+", livekit_version)[:3]) >= (1, 8, 9):
        assert {key for key, _ in carried} == set(ids)


async def test_a_realtime_models_tokens_reported_after_its_turn_completed_go_to_the_next_assistant_turn(pipeline):
    """A realtime model reports a response's usage when the provider sends it, which for a
    response cut short may be after LiveKit committed its message; LiveKit's metrics do not
    tag it with a speech. The rule: such tokens go to the next assistant turn completed, so
    the session's totals are LiveKit's."""
    session_id = f"lk-late-tokens-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)
    realtime = LateTranscriptRealtime()
    session, agent = AgentSession(llm=realtime.model, vad=None, user_away_timeout=None), Agent(instructions="You are a test agent.")
    recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit-realtime",
                                     settings=pipeline.settings, resume_source=resume_source_for(pipeline.settings))
    await session.start(agent)
    try:
        await realtime.user_turn("What time is it?", "It is noon.", item_id="user-1")
        await eventually(lambda: len(messages(session.history)) == 2, what="the first exchange committed", timeout=30)
        await recording.wait_recorded()
        realtime.report_usage(input_tokens=50, output_tokens=6, request_id="reply-user-1")  # late: its turn is complete
        await realtime.user_turn("Thanks", "You're welcome.", item_id="user-2")
        await eventually(lambda: len(messages(session.history)) == 4, what="the second exchange committed", timeout=30)
        realtime.report_usage(input_tokens=70, output_tokens=5, request_id="reply-user-2")  # late again
        await recording.wait_recorded()
        await realtime.user_turn("Bye", "Goodbye.", item_id="user-3")
        await eventually(lambda: len(messages(session.history)) == 6, what="the third exchange committed", timeout=30)
    finally:
        await session.aclose()
    assert await recording.wait_closed(TIMEOUT) and recording.failures == 0

    await eventually(lambda: finalized(pipeline, key), what="the session finalized")
    stored = conversation(turns_of(pipeline, key))
    assert [(speaker, text, tokens_in, tokens_out) for _, speaker, text, _, _, tokens_in, tokens_out in stored] == [
        ("user", "What time is it?", 0, 0),
        ("assistant", "It is noon.", 0, 0),
        ("user", "Thanks", 0, 0),
        ("assistant", "You're welcome.", 50, 6),
        ("user", "Bye", 0, 0),
        ("assistant", "Goodbye.", 70, 5),
    ]


def stored_turn_of(row):
    return StoredTurn(row["turn_index"], row["speaker"], row["text"], row["status"], row["started_at"], row["ended_at"],
                      row["input_tokens"], row["output_tokens"], None, row["barged_in"])


# -- an agent process SIGKILLed mid-reply, and restarted ----------------------------------
def agent_process(settings, phase: str, session_id: str, log: Path) -> ScriptProcess:
    """``tests/adapters/livekit_agent.py`` as a child process, with its JSON progress lines."""
    return ScriptProcess(
        "tests.adapters.livekit_agent", phase, session_id, env=settings.as_environment(), log_path=log, name=f"livekit-agent-{phase}"
    )


@pytest.mark.parametrize("path", ["text", "voice"])
def test_an_agent_killed_mid_reply_resumes_with_its_conversation_rebuilt_from_turnlog(pipeline, tmp_path, path):
    """On the voice path the story is generated at once and plays for two minutes: the
    store holds the words played (what LiveKit's synchronizer released), never the
    words generated ahead of the audio."""
    from tests.adapters.livekit_agent import STORY

    session_id = f"lk-crash-{path}-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)
    first = agent_process(pipeline.settings, "first" if path == "text" else "first-voice", session_id, tmp_path / "first.log")
    first.first_with("speaking", TIMEOUT)
    started = time.monotonic()
    # Mid-reply: the agent's partial text is in the store, then the process is SIGKILLed.
    partial = wait_until(
        lambda: (t := stored_turn(pipeline, key, 3)) and t["status"] == "partial" and len(t["text"]) >= 40 and t,
        timeout=TIMEOUT,
        what="the story's partial text stored",
    )
    first.process.kill()
    assert STORY.startswith(partial["text"])
    if path == "voice":
        # At most what 20 ms a character of audio could have played by the kill (and a second).
        assert len(partial["text"]) <= (time.monotonic() - started + 1) / 0.02 < len(STORY)

    second = agent_process(pipeline.settings, "resume", session_id, tmp_path / "second.log")
    resumed = second.first_with("resumed", TIMEOUT)
    done = second.first_with("done", TIMEOUT)
    assert second.process.popen.wait(TIMEOUT) == 0

    # What the restarted agent's LiveKit ChatContext held, rebuilt from turnlog: the unfinished
    # reply is there (marked interrupted) with at least the text the store had when it died.
    heard = resumed["chat_ctx"][3][1]
    assert resumed["epoch"] == 1 and resumed["resumed"] is True
    assert resumed["chat_ctx"] == [
        ["user", "Hello", False],
        ["assistant", "Hi! How can I help you today?", False],
        ["user", "Tell me a story", False],
        ["assistant", heard, True],
    ]
    assert heard.startswith(partial["text"]) and STORY.startswith(heard)
    assert resumed["history"] == resumed["chat_ctx"]
    # The tool LiveKit ran for the greeting, before the kill, is back before the greeting.
    assert resumed["items"][:4] == [
        ["message", "user", "Hello"],
        ["function_call", "look_up_caller", {}],
        ["function_call_output", "look_up_caller", "The caller is Ada.", False],
        ["message", "assistant", "Hi! How can I help you today?"],
    ]
    # And the model saw that conversation on the next turn.
    assert done["llm_saw"] == [*resumed["chat_ctx"], ["user", "What happened next?", False]]

    row = wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="finalized after the restart")
    assert conversation(turns_of(pipeline, key)) == [
        (0, "user", "Hello", "complete", False, 0, 0),
        (1, "assistant", "Hi! How can I help you today?", "complete", False, 24, 18),  # the tool's step and the reply
        (2, "user", "Tell me a story", "complete", False, 0, 0),
        (3, "assistant", heard, "interrupted", False, 0, 0),
        (4, "user", "What happened next?", "complete", False, 0, 0),
        (5, "assistant", "The dragon slept.", "complete", False, 70, 4),
    ]
    payloads, _ = logged_events(pipeline, key)
    assert fold_events(payloads).seqs == list(range(len(payloads)))
    assert (row["epoch"], row["turn_count"], row["interrupted_turn_count"]) == (1, 6, 1)
    assert (row["input_tokens"], row["output_tokens"]) == (94, 22)
    assert stored_turn(pipeline, key, 1)["tool_calls"] == [
        {"name": "look_up_caller", "arguments": {}, "result": "The caller is Ada."}
    ]


def test_an_agent_killed_while_the_user_speaks_after_a_dropped_turn_resumes_without_the_dropped_words(pipeline, tmp_path):
    """The user's "never mind" is dropped by LiveKit (``StopResponse``); the process is
    SIGKILLed while the user says the next words, heard through LiveKit's audio
    recognition. The store holds those words alone as the open turn, and the restarted
    agent's context has them, not the dropped ones."""
    session_id = f"lk-crash-dropped-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)
    first = agent_process(pipeline.settings, "first-dropped", session_id, tmp_path / "first.log")
    first.first_with("speaking", TIMEOUT)
    partial = wait_until(
        lambda: (t := stored_turn(pipeline, key, 3)) and t["status"] == "partial" and t,
        timeout=TIMEOUT,
        what="the user's words after the dropped turn stored",
    )
    first.process.kill()
    assert (partial["speaker"], partial["text"]) == ("user", "Tell me a")
    dropped = stored_turn(pipeline, key, 2)
    assert (dropped["speaker"], dropped["text"], dropped["status"]) == ("user", "", "complete")

    second = agent_process(pipeline.settings, "resume", session_id, tmp_path / "second.log")
    resumed = second.first_with("resumed", TIMEOUT)
    done = second.first_with("done", TIMEOUT)
    assert second.process.popen.wait(TIMEOUT) == 0
    assert resumed["resumed"] is True and resumed["chat_ctx"] == [
        ["user", "Hello", False],
        ["assistant", "Hi! How can I help you today?", False],
        ["user", "Tell me a", True],
    ]
    assert resumed["history"] == resumed["chat_ctx"]
    assert done["llm_saw"] == [*resumed["chat_ctx"], ["user", "What happened next?", False]]

    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="finalized after the restart")
    assert conversation(turns_of(pipeline, key)) == [
        (0, "user", "Hello", "complete", False, 0, 0),
        (1, "assistant", "Hi! How can I help you today?", "complete", False, 24, 18),
        (2, "user", "", "complete", False, 0, 0),
        (3, "user", "Tell me a", "interrupted", False, 0, 0),
        (4, "user", "What happened next?", "complete", False, 0, 0),
        (5, "assistant", "The dragon slept.", "complete", False, 70, 4),
    ]


async def test_speech_said_outside_the_chat_context_is_stored_but_left_out_of_a_resumed_context(pipeline):
    """say(..., add_to_chat_ctx=False): spoken to the user, not in LiveKit's history. It stays in
    the transcript, marked out of the LLM's context, and a resumed job's context leaves it out."""
    session_id = f"lk-aside-{uuid.uuid4().hex[:6]}"
    key = session_key(FLEET, session_id)
    session, agent = new_session(ScriptedLLM(REPLIES)), Agent(instructions="You are a test agent.")
    recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit",
                                     settings=pipeline.settings, resume_source=resume_source_for(pipeline.settings))
    await session.start(agent)
    try:
        await session.run(user_input="Hello")
        await session.say("Please hold while I check.", add_to_chat_ctx=False)
        await recording.wait_recorded()
    finally:
        await recording.aclose()  # stops recording; the session stays resumable
        await session.aclose()
    assert recording.failures == 0
    seen = messages(session.history)
    assert seen == [("user", "Hello", False), ("assistant", "Hi! How can I help you today?", False)]
    stored = await eventually(lambda: (rows := turns_of(pipeline, key)) and len(rows) == 3
                              and all(t["status"] == "complete" for t in rows) and rows, what="three turns stored")
    assert [(t["speaker"], t["text"], t["attributes"]) for t in stored] == [
        ("user", "Hello", None), ("assistant", "Hi! How can I help you today?", None),
        ("assistant", "Please hold while I check.", {"out_of_context": True}),
    ]

    llm = ScriptedLLM(REPLIES)
    session, agent = new_session(llm), Agent(instructions="You are a test agent.")
    recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit",
                                     settings=pipeline.settings, resume_source=resume_source_for(pipeline.settings))
    assert recording.resumed
    assert [t.in_context for t in recording.recorded.turns] == [True, True, False]
    assert messages(agent.chat_ctx) == seen and messages(session.history) == seen
    await session.start(agent)
    try:
        await session.run(user_input="wait, how much is it?")
    finally:
        await session.aclose()
    assert await recording.wait_closed(TIMEOUT) and recording.failures == 0
    assert [m for m in llm.contexts[-1] if m[0] in ("user", "assistant")] == [*seen, ("user", "wait, how much is it?", False)]
