"""The Pipecat adapter driven by Pipecat's own machinery on the real broker and Postgres.

The voice-bot tests run a real ``PipelineWorker`` over ``STT -> user aggregator
-> LLM -> TTS -> output transport -> assistant aggregator``
(``tests/adapters/pipecat_call.py``): Pipecat's ``STTService`` turns the
caller's audio into transcripts, the user aggregator's VAD and turn
strategies decide when the user's turn starts (interrupting the bot) and
ends, and ``BaseOutputTransport`` plays the TTS audio in real time, sending
the bot-speaking frames and releasing the words as they are played. The
realtime test uses ``pipecat.tests.utils.run_test``; the crash tests SIGKILL a
Pipecat agent process and restart it.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import recorder_for, require_extra

require_extra("pipecat", "pipecat")

from pipecat.frames.frames import (
    CancelFrame,
    InputTransportMessageFrame,
    LLMFullResponseEndFrame,
    LLMTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.tests import utils as pipecat_test_utils
from pipecat.tests.utils import SleepFrame, run_test
from pipecat.turns.user_mute import AlwaysUserMuteStrategy
from sqlalchemy import select

from turnlog.adapters.pipecat import TurnlogObserver, history_messages
from turnlog.deploy.processes import ServiceProcess
from turnlog.producers import StoredTurn
from turnlog.schemas.session_keys import session_key
from turnlog.sinks.tables import transcript_turns

from tests.adapters.pipecat_agent import SYSTEM, aggregator_pair
from tests.adapters.pipecat_call import Call, says, voice_pair
from tests.adapters.pipecat_services import (
    FunctionCall,
    HeardDelta,
    HeardFinal,
    RealtimeLLM,
    Reply,
    Responds,
    ScriptedLLM,
    ScriptedSTT,
    SilentTTS,
    Speaker,
    SpeechStarted,
    SpeechStopped,
)
from tests.adapters.stored import FLEET, turns
from tests.integration.test_pipeline import finalized
from tests.progress import ScriptProcess
from tests.support import wait_until

TIMEOUT = 120
ROOT = Path(__file__).resolve().parents[2]
USAGE_METRICS = PipelineParams(enable_metrics=True, enable_usage_metrics=True)  # ExternalUserTurnStopStrategy waits 0.5 s for late transcripts


@pytest.fixture(scope="module")
def ready_pipeline(pipeline):
    pipeline.wait_ready()
    return pipeline


@pytest.fixture
def attach_in_run_test(monkeypatch):
    """``run_test`` builds its own ``PipelineWorker``; this makes it call
    ``observer.attach(worker, aggregators)`` as the user's code does."""

    def attach(observer: TurnlogObserver, aggregators) -> None:
        class AttachedWorker(PipelineWorker):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                observer.attach(self, aggregators)

        monkeypatch.setattr(pipecat_test_utils, "PipelineWorker", AttachedWorker)

    return attach


def stored(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                select(
                    transcript_turns.c.turn_index, transcript_turns.c.speaker, transcript_turns.c.text,
                    transcript_turns.c.status, transcript_turns.c.barged_in,
                    transcript_turns.c.input_tokens, transcript_turns.c.output_tokens,
                )
                .where(transcript_turns.c.session_id == session_id)
                .order_by(transcript_turns.c.turn_index)
            )
        ]


async def test_the_store_holds_exactly_the_conversation_pipecat_saw(ready_pipeline):
    """A voice bot (STT, LLM, TTS, output transport): the user's turns come from the STT's
    transcripts and Pipecat's VAD and turn strategies, the bot's from the words its output
    transport played; the user talks over the third reply, and Pipecat's own interruption cuts
    it where the caller stopped hearing it."""
    pipeline = ready_pipeline
    session_id = f"pipecat-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    llm = ScriptedLLM([
        Reply(("Sure,", " what is", " the order number?"), prompt_tokens=42, completion_tokens=7),
        Reply(("Thanks.", " Order 1234 shipped", " on Monday.", " It should arrive by Friday at the latest."),
              prompt_tokens=30, completion_tokens=12),
        Reply(("Last Monday, the 3rd.",), prompt_tokens=50, completion_tokens=6),
    ])
    speaker = Speaker()
    async with recorder_for(pipeline.settings) as recorder:
        observer = await TurnlogObserver.open(recorder, session_id, fleet=FLEET, agent_id="pipecat", resume_timeout=TIMEOUT)
        assert (observer.resumed, observer.messages) == (False, [])
        context = LLMContext([SYSTEM, *observer.messages])
        aggregators = voice_pair(context)
        user, assistant = aggregators
        bot = Pipeline([ScriptedSTT(), user, llm, SilentTTS(seconds_per_word=0.2), speaker, assistant])
        async with Call(bot, observer, aggregators, USAGE_METRICS) as call:
            await call.send(*says("Hi there,", "I need help with my order.", interim="Hi"))
            await call.until(said(context, speaker, 2), "the first reply played")
            await call.send(*says("It is 1234."))
            # The user talks over the reply once "on Monday." was played.
            await call.until(played(speaker, "on Monday."), "the second reply played up to 'on Monday.'")
            await call.send(*says("Wait, which Monday?", interim="Wait,"))
            await call.until(said(context, speaker, 6), "the third reply played")
            await call.end()  # on_pipeline_finished ends the session
        await observer.wait_closed(TIMEOUT)
        assert observer.session.closed and observer.errors == []

    row = wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="the Pipecat session finalized")
    # Word by word here (Pipecat 1.14 joins the pieces of a streamed reply cut by an
    # interruption with two spaces in its context: the exact text is checked against it below).
    assert [(i, s, " ".join(t.split()), *rest) for i, s, t, *rest in stored(pipeline, key)] == [
        (0, "user", "Hi there, I need help with my order.", "complete", False, 0, 0),
        (1, "assistant", "Sure, what is the order number?", "complete", False, 42, 7),
        (2, "user", "It is 1234.", "complete", False, 0, 0),
        (3, "assistant", "Thanks. Order 1234 shipped on Monday.", "complete", True, 30, 12),
        (4, "user", "Wait, which Monday?", "complete", False, 0, 0),
        (5, "assistant", "Last Monday, the 3rd.", "complete", False, 50, 6),
    ]
    assert (row["end_reason"], row["turn_count"], row["interrupted_turn_count"]) == ("completed", 6, 0)
    assert (row["input_tokens"], row["output_tokens"]) == (122, 25)
    # What Pipecat's own context holds is what turnlog stored, turn by turn.
    assert context.messages[1:] == [{"role": s, "content": t} for _, s, t, *_ in stored(pipeline, key)]
    # ... and what the LLM was given for its last reply is that conversation up to the question.
    assert llm.contexts[-1][1:] == context.messages[1:-1]


def said(context: LLMContext, speaker: Speaker, turns: int) -> Callable[[], bool]:
    """The probe: the context holds the system prompt and ``turns`` turns, and the bot is silent."""
    return lambda: len(context.messages) == 1 + turns and not speaker.bot_speaking


def played(speaker: Speaker, words: str) -> Callable[[], bool]:
    """The probe: the output transport has played the bot's words up to ``words``. (How many
    ``TTSTextFrame``s a reply's words come in depends on the Pipecat release.)"""
    return lambda: "".join(speaker.spoken).endswith(words)


async def test_a_reply_cut_off_by_a_cancelled_pipeline_is_kept_interrupted_not_barged_in(ready_pipeline):
    """The caller hangs up while the bot speaks: the reply is kept ``interrupted`` with the words
    the output transport played, not ``barged_in`` (the user did not cut in)."""
    pipeline = ready_pipeline
    session_id = f"pipecat-cancel-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    llm = ScriptedLLM([Reply(("Let me look", " that up for you.", " It will take a few seconds, please hold on."))])
    speaker = Speaker()
    async with recorder_for(pipeline.settings) as recorder:
        observer = await TurnlogObserver.open(recorder, session_id, fleet=FLEET, agent_id="pipecat", resume_timeout=TIMEOUT)
        context = LLMContext([SYSTEM])
        aggregators = voice_pair(context)
        user, assistant = aggregators
        bot = Pipeline([ScriptedSTT(), user, llm, SilentTTS(seconds_per_word=0.2), speaker, assistant])
        async with Call(bot, observer, aggregators) as call:
            await call.send(*says("Where is my parcel?"))
            await call.until(played(speaker, "that up for you."), "the reply's first sentence played")
            await call.end(CancelFrame())  # the caller hangs up mid-reply
        await observer.wait_closed(TIMEOUT)

    row = wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="the cancelled session finalized")
    assert "".join(speaker.spoken) == "Let me look that up for you."
    assert stored(pipeline, key) == [
        (0, "user", "Where is my parcel?", "complete", False, 0, 0),
        (1, "assistant", "Let me look that up for you.", "interrupted", False, 0, 0),
    ]
    assert (row["end_reason"], row["turn_count"], row["interrupted_turn_count"]) == ("cancelled", 2, 1)
    assert context.messages[1:] == [{"role": s, "content": t} for _, s, t, *_ in stored(pipeline, key)]


@pytest.mark.parametrize("given", [True, False], ids=["given-to-the-worker", "made-up-by-pipecat"])
async def test_the_turn_spans_carry_pipecats_conversation_id(ready_pipeline, recorder_spans, monkeypatch, given):
    """With turnlog's tracing on, the span of every turn carries the conversation id of
    Pipecat's own ``conversation`` span (``enable_tracing=True``), under Pipecat's key
    ``conversation.id``: the one given to the worker, or the one Pipecat made up."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    pipecat_spans = InMemorySpanExporter()  # Pipecat's own spans, kept apart from turnlog's
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(pipecat_spans))
    monkeypatch.setattr(trace, "get_tracer", lambda name, *args, **kwargs: provider.get_tracer(name))

    pipeline = ready_pipeline
    session_id = f"pipecat-trace-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    options = {"conversation_id": f"conversation-{uuid.uuid4()}"} if given else {}
    llm = ScriptedLLM([Reply(("Sure,", " what is", " the order number?"))])
    speaker = Speaker()
    async with recorder_for(pipeline.settings) as recorder:
        observer = await TurnlogObserver.open(recorder, session_id, fleet=FLEET, agent_id="pipecat", resume_timeout=TIMEOUT)
        context = LLMContext([SYSTEM])
        aggregators = voice_pair(context)
        user, assistant = aggregators
        bot = Pipeline([ScriptedSTT(), user, llm, SilentTTS(seconds_per_word=0.05), speaker, assistant])
        async with Call(bot, observer, aggregators, enable_tracing=True, **options) as call:
            await call.send(*says("I need help with my order."))
            await call.until(said(context, speaker, 2), "the reply played")
            await call.end()
        await observer.wait_closed(TIMEOUT)
        assert observer.errors == [] and observer.failures == 0
    provider.shutdown()

    [conversation] = [span for span in pipecat_spans.get_finished_spans() if span.name == "conversation"]
    conversation_id = conversation.attributes["conversation.id"]
    assert conversation_id == options.get("conversation_id", conversation_id) and conversation_id
    spans = recorder_spans.turns(key)
    assert [(index, spans[index]["turnlog.speaker"], spans[index].get("conversation.id")) for index in sorted(spans)] == [
        (0, "user", conversation_id),
        (1, "assistant", conversation_id),
    ]


async def test_with_stt_llm_and_tts_muted_speech_is_not_recorded_and_tokens_are_gross_of_the_cache(ready_pipeline):
    """Issue 20, Pipecat 1 and 4: transcripts the user aggregator's mute filter drops while the
    output transport plays the bot's reply are not a turn (today's tree opened one, left
    ``interrupted`` at the end), and input tokens are gross of the prompt cache whichever way the
    service reports ``prompt_tokens``."""
    pipeline = ready_pipeline
    session_id = f"pipecat-mute-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    llm = ScriptedLLM([
        Reply(("Sure.", " What is the", " order number you were given?"), prompt_tokens=40, completion_tokens=7, cached=100),
        Reply(("Thanks.", " Order 1234", " shipped on Monday and arrives on Friday."), prompt_tokens=60, completion_tokens=9),
    ])
    speaker = Speaker()
    async with recorder_for(pipeline.settings) as recorder:
        observer = await TurnlogObserver.open(recorder, session_id, fleet=FLEET, agent_id="pipecat", resume_timeout=TIMEOUT)
        context = LLMContext([SYSTEM, *observer.messages])
        aggregators = voice_pair(context, mute=[AlwaysUserMuteStrategy()])
        user, assistant = aggregators
        bot = Pipeline([ScriptedSTT(), user, llm, SilentTTS(seconds_per_word=0.2), speaker, assistant])
        async with Call(bot, observer, aggregators, USAGE_METRICS) as call:
            await call.send(*says("Hi, I need help", "with my order.", interim="Hi"))
            # The output transport plays the reply: the user is muted, Pipecat drops what they say.
            await call.until(played(speaker, "Sure."), "the first reply's first sentence played")
            await call.send(*says("um, hold on", interim="um"))
            await call.until(said(context, speaker, 2), "the first reply played")
            await call.send(*says("It is 1234."))
            await call.until(played(speaker, "Thanks."), "the second reply's first sentence played")
            await call.send(*says("sorry, one more thing", interim="sorry"))
            await call.until(said(context, speaker, 4), "the second reply played")
            await call.end()
        await observer.wait_closed(TIMEOUT)
        assert observer.session.closed and observer.errors == []

    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="the muted session finalized")
    # The LLM answered the system prompt and three turns: the muted words never reached it.
    assert [m["role"] for m in llm.contexts[-1]] == ["system", "user", "assistant", "user"]
    assert [m["content"] for m in llm.contexts[-1]][1::2] == ["Hi, I need help with my order.", "It is 1234."]
    # Turn by turn, what Pipecat's context holds is what turnlog stored; the muted speech is in neither.
    assert [(s, t) for _, s, t, *_ in turns(pipeline, key)] == [(m["role"], m["content"]) for m in context.messages[1:]]
    assert [(i, status, tin, tout) for i, _, _, status, tin, tout, *_ in turns(pipeline, key)] == [
        (0, "complete", 0, 0), (1, "complete", 140, 7), (2, "complete", 0, 0), (3, "complete", 60, 9),
    ]


def stored_turns(pipeline, session_id) -> list[StoredTurn]:
    """The session's turns as a resume gives them back (``StoredTurn``, with tool calls and attributes)."""
    with pipeline.store.engine.connect() as conn:
        rows = conn.execute(
            select(transcript_turns).where(transcript_turns.c.session_id == session_id).order_by(transcript_turns.c.turn_index)
        ).all()
    return [StoredTurn.from_row(row._mapping) for row in rows]


def same_ids(messages: list[dict]) -> list[dict]:
    """``messages`` with each tool call id replaced by its place among them: Pipecat's ids come from
    the LLM, a rebuilt context's from turnlog (which does not store them)."""
    ids: dict[str, str] = {}

    def renamed(call_id: str) -> str:
        return ids.setdefault(call_id, f"call-{len(ids)}")

    out = []
    for message in messages:
        message = dict(message)
        if "tool_calls" in message:
            message["tool_calls"] = [{**c, "id": renamed(c["id"])} for c in message["tool_calls"]]
        if "tool_call_id" in message:
            message["tool_call_id"] = renamed(message["tool_call_id"])
        out.append(message)
    return out


def send_text(content: str) -> InputTransportMessageFrame:
    """What the input transport pushes for a client's RTVI ``send-text`` message (answer aloud, at once)."""
    return InputTransportMessageFrame(message={
        "label": "rtvi-ai", "type": "send-text", "id": f"msg-{uuid.uuid4().hex[:6]}",
        "data": {"content": content, "options": {"run_immediately": True, "audio_response": True}},
    })


async def test_typed_input_and_a_completed_function_call_are_recorded_as_pipecat_holds_them(ready_pipeline):
    """Issue 33, Pipecat 6 and 7: the user asks aloud, the LLM calls a function (Pipecat's
    function-calling machinery runs the registered handler), answers with its result, and the
    user types a question (RTVI ``send-text``, handled by the worker's own ``RTVIProcessor``).
    The typed words are a user turn marked ``typed``; the call (name, arguments, result) is on
    the assistant turn that asked for it; a context rebuilt from the store is Pipecat's own."""
    pipeline = ready_pipeline
    session_id = f"pipecat-tools-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    llm = ScriptedLLM([
        Reply((), prompt_tokens=30, completion_tokens=5, calls=[FunctionCall("get_order", {"order": "1234"})]),
        Reply(("Order 1234", " shipped on Monday."), prompt_tokens=45, completion_tokens=6),
        Reply(("Sure,", " what is the new address?"), prompt_tokens=60, completion_tokens=7),
    ])

    async def get_order(params) -> None:
        await params.result_callback({"order": params.arguments["order"], "status": "shipped", "on": "Monday"})

    llm.register_function("get_order", get_order)
    speaker = Speaker()
    async with recorder_for(pipeline.settings) as recorder:
        observer = await TurnlogObserver.open(recorder, session_id, fleet=FLEET, agent_id="pipecat", resume_timeout=TIMEOUT)
        context = LLMContext([SYSTEM])
        aggregators = voice_pair(context)
        user, assistant = aggregators
        bot = Pipeline([ScriptedSTT(), user, llm, SilentTTS(seconds_per_word=0.05), speaker, assistant])
        async with Call(bot, observer, aggregators, USAGE_METRICS) as call:
            await call.send(*says("Where is order 1234?"))
            await call.until(said(context, speaker, 4), "the answer with the function's result played")
            await call.send(send_text("Can you also change the delivery address?"))
            await call.until(said(context, speaker, 6), "the answer to the typed question played")
            await call.end()
        await observer.wait_closed(TIMEOUT)
        assert observer.session.closed and observer.errors == [] and observer.failures == 0

    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="the session finalized")
    found = stored_turns(pipeline, key)
    assert [(t.turn_index, t.speaker, t.text, t.status, t.kind, t.tool_calls) for t in found] == [
        (0, "user", "Where is order 1234?", "complete", "spoken", None),
        (1, "assistant", "", "complete", "spoken", (
            {"name": "get_order", "arguments": {"order": "1234"},
             "result": {"order": "1234", "status": "shipped", "on": "Monday"}},
        )),
        (2, "assistant", "Order 1234 shipped on Monday.", "complete", "spoken", None),
        (3, "user", "Can you also change the delivery address?", "complete", "typed", None),
        (4, "assistant", "Sure, what is the new address?", "complete", "spoken", None),
    ]
    # The two LLM calls of the first answer (the function call, then the text) are counted once.
    assert (found[1].input_tokens + found[2].input_tokens, found[4].input_tokens) == (75, 60)
    assert found[3].attributes == {"kind": "typed"} and found[0].attributes is None
    # What a resumed bot's context is rebuilt from is what Pipecat's own context holds, message by message.
    assert same_ids(history_messages(found)) == same_ids(context.messages[1:])
    assert [m["role"] for m in context.messages[1:]] == ["user", "assistant", "tool", "assistant", "user", "assistant"]


async def test_a_function_call_cancelled_by_the_user_speaking_is_recorded_cancelled(ready_pipeline):
    """Issue 33, Pipecat 7: the user talks while a function runs; Pipecat's LLM service cancels it
    (``cancel_on_interruption``) and its context holds the call with ``CANCELLED``: turnlog stores
    the call with its arguments and the cancellation, before the user's next turn, as Pipecat does."""
    pipeline = ready_pipeline
    session_id = f"pipecat-cancelled-call-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    llm = ScriptedLLM([
        Reply((), calls=[FunctionCall("track_parcel", {"parcel": "P-77"})]),
        Reply(("Okay,", " no problem."), prompt_tokens=50, completion_tokens=4),
    ])
    started = asyncio.Event()

    async def track_parcel(params) -> None:
        started.set()
        await asyncio.Event().wait()  # until Pipecat cancels it

    llm.register_function("track_parcel", track_parcel, cancel_on_interruption=True)
    speaker = Speaker()
    async with recorder_for(pipeline.settings) as recorder:
        observer = await TurnlogObserver.open(recorder, session_id, fleet=FLEET, agent_id="pipecat", resume_timeout=TIMEOUT)
        context = LLMContext([SYSTEM])
        aggregators = voice_pair(context)
        user, assistant = aggregators
        bot = Pipeline([ScriptedSTT(), user, llm, SilentTTS(seconds_per_word=0.05), speaker, assistant])
        async with Call(bot, observer, aggregators) as call:
            await call.send(*says("Where is my parcel P-77?"))
            await call.until(started.is_set, "the function running")
            await call.send(*says("Actually, never mind."))
            await call.until(said(context, speaker, 5), "the answer after the cancelled call played")
            await call.end()
        await observer.wait_closed(TIMEOUT)
        assert observer.session.closed and observer.errors == [] and observer.failures == 0

    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="the session finalized")
    found = stored_turns(pipeline, key)
    assert [(t.turn_index, t.speaker, t.text, t.status, t.tool_calls) for t in found] == [
        (0, "user", "Where is my parcel P-77?", "complete", None),
        (1, "assistant", "", "complete", ({"name": "track_parcel", "arguments": {"parcel": "P-77"},
                                          "result": {"cancelled": True}},)),
        (2, "user", "Actually, never mind.", "complete", None),
        (3, "assistant", "Okay, no problem.", "complete", None),
    ]
    assert [m.get("content") for m in context.messages[1:] if m["role"] == "tool"] == ["CANCELLED"]
    assert same_ids(history_messages(found)) == same_ids(context.messages[1:])


async def test_realtime_deltas_and_a_late_transcript_are_recorded_as_pipecat_holds_them(ready_pipeline, attach_in_run_test):
    """Issue 20, Pipecat 2: OpenAI Realtime's transcription deltas add up to the user's partial text
    (today's tree kept the last fragment), and a transcript that comes after the response started
    is still the turn before the response's, as in Pipecat's context."""
    pipeline = ready_pipeline
    session_id = f"pipecat-realtime-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    async with recorder_for(pipeline.settings) as recorder:
        observer = await TurnlogObserver.open(recorder, session_id, fleet=FLEET, agent_id="pipecat", resume_timeout=TIMEOUT)
        context = LLMContext([SYSTEM])
        aggregators = aggregator_pair(context)
        attach_in_run_test(observer, aggregators)
        user, assistant = aggregators
        await run_test(
            Pipeline([user, RealtimeLLM(), assistant]),
            frames_to_send=[
                SleepFrame(sleep=0.2),
                # The response starts before the user's transcript comes (no deltas for this item).
                SpeechStarted(), SpeechStopped(), SleepFrame(sleep=0.1),
                Responds(("It shipped",), finished=False), SleepFrame(sleep=0.05),
                HeardFinal("Where is my order?"), SleepFrame(sleep=0.05),
                LLMTextFrame(" yesterday."), LLMFullResponseEndFrame(), SleepFrame(sleep=0.3),
                # The next item is transcribed as deltas; the call ends before it is completed.
                SpeechStarted(),
                HeardDelta(item_id="item-2", delta="Thanks,"), HeardDelta(item_id="item-2", delta=" that is"),
                HeardDelta(item_id="item-2", delta=" all."), SleepFrame(sleep=0.2),
            ],
        )
        await observer.wait_closed(TIMEOUT)
        assert observer.session.closed and observer.errors == []

    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="the realtime session finalized")
    stored_turns = turns(pipeline, key)
    assert context.messages[1:] == [
        {"role": "user", "content": "Where is my order?"}, {"role": "assistant", "content": "It shipped yesterday."},
    ]
    assert [(s, t) for _, s, t, status, *_ in stored_turns if status == "complete"] == [
        (m["role"], m["content"]) for m in context.messages[1:]
    ]
    assert [(i, s, t, status) for i, s, t, status, *_ in stored_turns] == [
        (0, "user", "Where is my order?", "complete"),
        (1, "assistant", "It shipped yesterday.", "complete"),
        (2, "user", "Thanks, that is all.", "interrupted"),  # the deltas heard before the hang-up
    ]


class AgentProcess(ScriptProcess):
    """``tests/adapters/pipecat_agent.py`` as a child process, with its JSON lines read one by one."""

    def __init__(self, settings, session_id: str, log: Path) -> None:
        super().__init__("tests.adapters.pipecat_agent", session_id, env=settings.as_environment(), log_path=log, name="pipecat-agent")
        self.lines_taken = 0

    def next_line(self, timeout: float = TIMEOUT) -> dict:
        """The line after the last one taken: the test checks every line the agent prints, in order."""
        index = self.lines_taken
        line = self.wait_for(lambda lines: lines[index] if len(lines) > index else None, f"line {index}", timeout)
        self.lines_taken += 1
        return line


def test_a_pipecat_agent_killed_mid_reply_resumes_with_its_llm_context_rebuilt_from_turnlog(ready_pipeline, tmp_path):
    pipeline = ready_pipeline
    session_id = f"pipecat-crash-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    said_before = [
        {"role": "user", "content": "I'd like to change my delivery address."},
        {"role": "assistant", "content": "Of course. What is the new address?"},
        {"role": "user", "content": "12 Elm Street, Springfield."},
    ]
    cut_off = {"role": "assistant", "content": "Thanks, I'm updating your order to 12 Elm"}
    # What the user started to say after the muted words (which Pipecat dropped, and turnlog too).
    started = {"role": "user", "content": "Hello?"}

    first = AgentProcess(pipeline.settings, session_id, tmp_path / "first.log")
    assert first.next_line() == {"resumed": False, "epoch": 0, "context": [SYSTEM]}
    assert first.next_line() == {"ready": True, "open_turns": [3, 4]}
    first.process.kill()  # mid-reply: the assistant's turn 3 and the user's turn 4 are open

    second = AgentProcess(pipeline.settings, session_id, tmp_path / "second.log")
    # The restarted agent's LLM context is rebuilt from turnlog: the three turns said
    # before the kill, and the words of the reply the caller heard before it.
    assert second.next_line() == {"resumed": True, "epoch": 1, "context": [SYSTEM, *said_before, cut_off, started]}
    assert second.next_line() == {"ended": True, "errors": []}
    assert second.process.popen.wait(timeout=TIMEOUT) == 0

    row = wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="the resumed session finalized")
    assert stored(pipeline, key) == [
        (0, "user", "I'd like to change my delivery address.", "complete", False, 0, 0),
        (1, "assistant", "Of course. What is the new address?", "complete", False, 20, 8),
        (2, "user", "12 Elm Street, Springfield.", "complete", False, 0, 0),
        (3, "assistant", "Thanks, I'm updating your order to 12 Elm", "interrupted", False, 0, 0),
        (4, "user", "Hello?", "interrupted", False, 0, 0),
        (5, "user", "Did it go through?", "complete", False, 0, 0),
        (6, "assistant", "Yes, it ships to 12 Elm Street.", "complete", False, 35, 9),
    ]
    assert (row["epoch"], row["end_reason"], row["turn_count"], row["interrupted_turn_count"]) == (1, "completed", 7, 2)


def test_a_voice_bot_killed_while_speaking_resumes_with_the_words_the_caller_heard(ready_pipeline, tmp_path):
    """The voice bot (STT, LLM, TTS, output transport) calls a function, answers, and is SIGKILLed
    while its output transport plays a later answer, after the caller said something Pipecat
    muted: the words played before the kill are stored (``interrupted``) and given back on resume
    with the function call and its result where Pipecat's context held them; the muted words are
    in neither."""
    pipeline = ready_pipeline
    session_id = f"pipecat-voice-crash-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    called = [
        {"role": "assistant", "tool_calls": [{"id": "turnlog_1_0", "type": "function", "function": {
            "name": "find_order", "arguments": '{"caller": "caller"}'}}]},
        {"role": "tool", "content": '{"order": "1234", "address": "3 Oak Lane"}', "tool_call_id": "turnlog_1_0"},
    ]
    said_before = [
        {"role": "user", "content": "I'd like to change my delivery address."},
        *called,
        {"role": "assistant", "content": "Of course. What is the new address?"},
        {"role": "user", "content": "12 Elm Street, Springfield."},
    ]
    heard = {"role": "assistant", "content": "Thanks. I'm updating your order to 12 Elm Street."}
    env = pipeline.settings.as_environment()
    first = ScriptProcess("tests.adapters.pipecat_voice_agent", session_id, env=env,
                          log_path=tmp_path / "first.log", name="pipecat-voice-first")
    assert first.first_with("resumed", TIMEOUT) == {"resumed": False, "epoch": 0, "context": [SYSTEM]}
    assert first.first_with("ready", TIMEOUT) == {"ready": True, "open_turns": [4]}
    first.process.kill()  # the bot is still speaking its answer (turn 4)

    second = ScriptProcess("tests.adapters.pipecat_voice_agent", session_id, env=env,
                           log_path=tmp_path / "second.log", name="pipecat-voice-second")
    resumed = second.first_with("resumed", TIMEOUT)
    assert second.first_with("ended", TIMEOUT) == {"ended": True, "errors": []}
    assert second.process.popen.wait(timeout=TIMEOUT) == 0

    row = wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="the voice session finalized")
    rows = stored(pipeline, key)
    # The restarted bot's context is the stored conversation, exactly: the function call and its
    # result as Pipecat's context held them, and the words played before the kill joined as Pipecat
    # joins them (1.14 puts two spaces between a streamed reply's sentences, in its context too),
    # so the texts below compare word by word.
    assert resumed["context"] == [SYSTEM, *history_messages(stored_turns(pipeline, key)[:5])]
    assert resumed["context"][2:4] == called
    assert [{**m, "content": " ".join(m["content"].split())} if m["role"] != "tool" and "content" in m else m
            for m in resumed["context"]] == [SYSTEM, *said_before, heard]
    assert (resumed["resumed"], resumed["epoch"]) == (True, 1)
    assert [(i, s, " ".join(t.split()), *rest) for i, s, t, *rest in rows] == [
        (0, "user", "I'd like to change my delivery address.", "complete", False, 0, 0),
        (1, "assistant", "", "complete", False, 0, 0),
        (2, "assistant", "Of course. What is the new address?", "complete", False, 20, 8),
        (3, "user", "12 Elm Street, Springfield.", "complete", False, 0, 0),
        (4, "assistant", "Thanks. I'm updating your order to 12 Elm Street.", "interrupted", False, 0, 0),
        (5, "user", "Did it go through?", "complete", False, 0, 0),
        (6, "assistant", "Yes, it ships to 12 Elm Street.", "complete", False, 35, 9),
    ]
    assert stored_turns(pipeline, key)[1].tool_calls == (
        {"name": "find_order", "arguments": {"caller": "caller"}, "result": {"order": "1234", "address": "3 Oak Lane"}},
    )
    assert (row["epoch"], row["end_reason"], row["turn_count"], row["interrupted_turn_count"]) == (1, "completed", 7, 1)


def test_the_example_agent_sigkilled_mid_call_resumes_and_its_llm_sees_the_stored_conversation(ready_pipeline, tmp_path):
    pipeline = ready_pipeline
    session_id = f"pipecat-example-{uuid.uuid4().hex[:8]}"
    key = session_key("support", session_id)  # the example records in fleet support
    env = {**pipeline.settings.as_environment(), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(ROOT / "examples" / "pipecat_agent.py"), session_id]

    crashed = ServiceProcess("example-crash", [*argv, "--crash"], env, tmp_path / "crash.log", stdout_pipe=True)
    assert crashed.popen.wait(timeout=TIMEOUT) == -9, crashed.log_path.read_text(errors="replace")[-3000:]
    assert crashed.popen.stdout.read().decode() == f"session {session_id}: new, context of 1 messages\n"

    resumed = ServiceProcess("example-resume", argv, env, tmp_path / "resume.log", stdout_pipe=True)
    assert resumed.popen.wait(timeout=TIMEOUT) == 0, resumed.log_path.read_text(errors="replace")[-3000:]
    line = resumed.popen.stdout.read().decode()
    assert line.startswith(f"session {session_id}: resumed, context of ")

    row = wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="the example's session finalized")
    assert (row["epoch"], row["end_reason"]) == (1, "completed")
    with pipeline.store.engine.connect() as conn:
        turns = conn.execute(
            select(transcript_turns.c.turn_index, transcript_turns.c.speaker, transcript_turns.c.text, transcript_turns.c.epoch)
            .where(transcript_turns.c.session_id == key)
            .order_by(transcript_turns.c.turn_index)
        ).all()
    before = [(speaker, text) for _, speaker, text, epoch in turns if epoch == 0 and text]
    after = [(speaker, text) for _, speaker, text, epoch in turns if epoch == 1]
    assert before[:3] == [
        ("user", "Hello, is this the support line?"),
        ("assistant", "You said: Hello, is this the support line? (2 messages in my context)"),
        ("user", "My parcel has not arrived."),
    ]
    assert line == f"session {session_id}: resumed, context of {1 + len(before)} messages\n"
    # The resumed bot's LLM answered with the stored conversation in its context:
    # the system prompt, every turn said before the kill, and the new question.
    assert after[:2] == [
        ("user", "Hello, is this the support line?"),
        ("assistant", f"You said: Hello, is this the support line? ({1 + len(before) + 1} messages in my context)"),
    ]
    assert [speaker for speaker, _ in after] == ["user", "assistant"] * 3


def test_a_realtime_agent_killed_mid_transcript_resumes_with_the_deltas_heard_so_far(ready_pipeline, tmp_path):
    """Issue 20, Pipecat 2, after a SIGKILL: the user turn OpenAI Realtime was transcribing as deltas
    is stored with all of them (today's tree kept the last fragment) and given back on resume,
    after the earlier exchange in the order Pipecat's context held it."""
    pipeline = ready_pipeline
    session_id = f"pipecat-realtime-crash-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, session_id)
    env = pipeline.settings.as_environment()
    first = ScriptProcess("tests.adapters.pipecat_realtime_agent", session_id, env=env,
                          log_path=tmp_path / "first.log", name="pipecat-realtime-first")
    assert first.first_with("resumed", TIMEOUT) == {"resumed": False, "context": [SYSTEM]}
    assert first.first_with("ready", TIMEOUT) == {"ready": True, "open_turns": [2]}
    first.process.kill()

    second = ScriptProcess("tests.adapters.pipecat_realtime_agent", session_id, env=env,
                           log_path=tmp_path / "second.log", name="pipecat-realtime-second")
    assert second.first_with("resumed", TIMEOUT) == {"resumed": True, "context": [
        SYSTEM,
        {"role": "user", "content": "Where is my order?"},
        {"role": "assistant", "content": "It shipped yesterday."},
        {"role": "user", "content": "Thanks, that is all."},
    ]}
    assert second.first_with("ended", TIMEOUT) == {"ended": True}
    assert second.process.popen.wait(timeout=TIMEOUT) == 0

    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what="the realtime session finalized")
    assert [(i, s, t, status) for i, s, t, status, *_ in turns(pipeline, key)] == [
        (0, "user", "Where is my order?", "complete"),
        (1, "assistant", "It shipped yesterday.", "complete"),
        (2, "user", "Thanks, that is all.", "interrupted"),
    ]
