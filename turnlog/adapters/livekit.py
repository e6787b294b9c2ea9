"""LiveKit Agents (``livekit-agents`` 1.x): record an ``AgentSession`` through turnlog.

Usage, in a LiveKit entrypoint (``pip install 'turnlog[livekit]'``)::

    from turnlog.adapters.livekit import record_session

    session = AgentSession(stt=..., llm=..., tts=..., vad=...)
    agent = Assistant()
    await record_session(session, agent, session_id=ctx.room.name, fleet="support", agent_id="assistant")
    await session.start(agent, room=ctx.room)

:func:`record_session` resumes the session if turnlog has it (a restarted job:
the agent's ``ChatContext`` and ``session.history`` are rebuilt from the stored
turns) and otherwise starts it; then it listens to the session:

- ``user_state_changed`` to ``speaking``: the user's turn opens (its index is
  taken), with no text yet; so a realtime model that sends the transcript after
  its reply still has the question indexed before the answer. A turn no words
  were transcribed for gives its index back when the agent's turn opens while
  the user is silent (LiveKit holds no words of it, and words said later are
  committed after the agent's; not with a realtime model that transcribes the
  user, whose transcript may come after its reply).
- ``user_input_transcribed``: the user's open turn. An interim transcript covers
  only the current segment; final segments accumulate, so the partial text is
  the final segments so far and the current interim, joined by spaces.
- the end of the user's turn: LiveKit's ``AudioRecognition`` calling the
  activity's ``on_end_of_turn`` hook (watched on the instance, see
  :class:`_EndOfTurnWatch`); when it returns True, LiveKit's transcript is
  cleared, so the open turn takes no more words and the next ones open a new
  turn. LiveKit then commits the turn's message (``conversation_item_added``,
  below) or drops it: ``StopResponse`` (or an error) from
  ``on_user_turn_completed``, an uninterruptible speech playing, a reply
  interrupted before it was scheduled, speech scheduling paused
  (``AgentActivity._user_turn_completed_task``, ``_pipeline_reply_task``). A
  dropped turn is completed with no text once LiveKit's end-of-turn task is
  done having scheduled no reply that carries it (:class:`_EndedTurn`).
  Not with a realtime model that transcribes the user: its transcript ends the turn.
- the last link of the session's text output chain (``session.output.transcription``
  followed through ``next_in_chain``; its ``capture_text`` and ``flush`` are
  watched on the instance, and still do what they did; a session without a
  text output gets one): the agent's open turn, with the text the room is sent.
  With a TTS that is the text LiveKit's ``TranscriptSynchronizer`` releases as
  the audio plays, so a partial holds the words played, never words generated
  ahead of the audio; text-only, the text as generated. At the end of a segment
  (``flush``) the partial is spooled at once.
- ``conversation_item_added``, a ``ChatMessage`` of role ``user`` or
  ``assistant``: the committed turn, with LiveKit's text (a user message
  completes the earliest turn LiveKit ended, else the open one). An assistant message
  with ``interrupted=True`` (barge-in) holds the words spoken before it, and is
  recorded ``barged_in``. Other roles and items are not recorded.
- the end of a speech (``SpeechHandle`` done) that opened the agent's turn
  and committed no assistant message: LiveKit interrupted it before any of it
  played (completed with no text, ``barged_in``), or it was spoken outside the
  chat context (``say(..., add_to_chat_ctx=False)``: completed with its text,
  ``in_context=False``, so a rebuilt context leaves it out as LiveKit's history does).
- ``session_usage_updated``: LLM tokens (``LLMModelUsage`` only: STT and TTS
  usage is not counted), cumulative per (provider, model); the difference since
  the previous one belongs to the speech LiveKit made the call for: the
  ``LLMMetrics.speech_id`` of the ``metrics_collected`` event emitted just
  before it (``AgentActivity._on_metrics_collected``). An assistant turn gets
  its speech's tokens, and those of no speech (a realtime model's) or of a
  speech that is over (reported after its turn completed, or of a speech that
  completed no turn); a speech still running keeps its own for its turn.
- ``speech_created``: which speeches are running (and which may commit a user
  turn LiveKit ended).
- ``function_tools_executed``: the tools LiveKit ran (name, arguments, and the
  output: its text, ``{"error": text}`` for a tool that raised, None for one
  with no output) become the ``tool_calls`` of the next assistant turn, the
  reply that reads them; a resume puts each back before that turn's message as
  LiveKit's history holds it (a ``FunctionCall`` and its ``FunctionCallOutput``;
  none for a call with no output). They are written with that turn: tools
  whose reply never comes (a user turn is committed first, the session closes,
  the process dies before the reply is committed) are not recorded. A value
  over the schema's bounds is kept as ``{"omitted": "<type>"}``.
- traces: the recorder's spans carry LiveKit's own ids, under the keys LiveKit's
  spans use (``livekit/agents/telemetry/trace_types.py``): an assistant turn
  its speech's ``lk.speech_id`` (``SpeechHandle.id``, on LiveKit's
  ``agent_turn`` span and in ``LLMMetrics``/``TTSMetrics.speech_id``); every turn
  of a job's session the job's ``lk.room_sid`` and ``lk.job_id`` and
  ``gen_ai.conversation.id`` (the room sid: what LiveKit stamps on its spans
  in a job). A no-op when turnlog's tracing is off.
- ``close``: the session ends in turnlog (reason ``participant_disconnected``,
  ``user_initiated`` or ``task_completed``), except when LiveKit closes it for
  ``job_shutdown`` or ``error``, or when the ``user_initiated`` close is the
  ``session.aclose()`` LiveKit's job process makes at a job's shutdown (a drain
  timeout, ``ctx.shutdown()``, a crashed entrypoint; see
  :func:`_closed_by_job_shutdown`): then it stays active, resumable by the next job.

LiveKit's event callbacks are synchronous: each one updates this module's turn
state at once and queues the recorder calls, which one writer task makes in
the order the events came (``turnlog.adapters._core.OrderedWriter``). Speakers
are ``"user"`` and ``"assistant"``; turn indexes are given in the order turns
open (a barge-in's user turn opens while the agent's is still open).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from livekit.agents import (
    Agent,
    AgentHandoff,
    AgentSession,
    ChatContext,
    ChatMessage,
    CloseEvent,
    CloseReason,
    ConversationItemAddedEvent,
    FunctionToolsExecutedEvent,
    MetricsCollectedEvent,
    SessionUsageUpdatedEvent,
    SpeechCreatedEvent,
    UserInputTranscribedEvent,
    UserStateChangedEvent,
)
from livekit.agents.job import get_job_context
from livekit.agents.llm import FunctionCall, FunctionCallOutput, RealtimeModel
from livekit.agents.metrics import LLMMetrics
from livekit.agents.metrics.usage import LLMModelUsage
from livekit.agents.voice.io import TextOutput
from livekit.agents.voice.speech_handle import SpeechHandle

from turnlog.adapters._core import (
    ASSISTANT,
    USER,
    OrderedWriter,
    PendingToolCalls,
    PendingUsage,
    conversation,
    framework_ids,
    open_or_resume,
)
from turnlog.producers import RecordedSession, ResumeSource, SessionRecorder, StoredTurn
from turnlog.schemas import ToolCall, TurnStatus
from turnlog.settings import TurnlogSettings

__all__ = [
    "AGENT_SPEAKER",
    "CONVERSATION_ID_ATTRIBUTE",
    "ENDING_REASONS",
    "JOB_ID_ATTRIBUTE",
    "ROOM_SID_ATTRIBUTE",
    "SPEECH_ID_ATTRIBUTE",
    "USER_SPEAKER",
    "LiveKitRecording",
    "chat_context_from_turns",
    "record_session",
]

logger = logging.getLogger(__name__)

#: Speaker of the turns of the user (LiveKit's role ``user``).
USER_SPEAKER = USER
#: Speaker of the agent's turns (LiveKit's role ``assistant``).
AGENT_SPEAKER = ASSISTANT
_ROLES = {USER_SPEAKER: "user", AGENT_SPEAKER: "assistant"}
#: Close reasons that end the session in turnlog; any other (``job_shutdown``,
#: ``error``) leaves it active, so the next job resumes it. ``user_initiated``
#: ends it only when the app closed the session (``session.shutdown()``,
#: ``session.aclose()``), not when LiveKit's job shutdown did (see
#: :func:`_closed_by_job_shutdown`).
ENDING_REASONS = frozenset({CloseReason.PARTICIPANT_DISCONNECTED, CloseReason.USER_INITIATED,
                            CloseReason.TASK_COMPLETED})
#: The trace attributes this adapter puts on the recorder's spans: LiveKit's own keys
#: (``livekit/agents/telemetry/trace_types.py``), so a join with LiveKit's spans is an equality.
#: An assistant turn's speech (``SpeechHandle.id``; LiveKit's ``agent_turn`` span).
SPEECH_ID_ATTRIBUTE = "lk.speech_id"
#: The job's room sid (LiveKit's ``job_entrypoint`` and ``agent_session`` spans).
ROOM_SID_ATTRIBUTE = "lk.room_sid"
#: The job's id (the same spans).
JOB_ID_ATTRIBUTE = "lk.job_id"
#: The conversation: the room sid, which LiveKit puts on every span of a job under this
#: GenAI key (``telemetry/gen_ai.py``, ``_conversation_id``).
CONVERSATION_ID_ATTRIBUTE = "gen_ai.conversation.id"
#: The name of the task LiveKit's job process runs a job in, shutdown included
#: (``livekit/agents/ipc/job_proc_lazy_main.py``, ``_JobProc._start_job``).
_JOB_TASK_NAME = "job_task"


async def record_session(
    session: AgentSession,
    agent: Agent,
    *,
    session_id: str,
    fleet: str,
    agent_id: str,
    metadata: Mapping[str, Any] | None = None,
    recorder: SessionRecorder | None = None,
    settings: TurnlogSettings | None = None,
    resume_source: ResumeSource | None = None,
    resume: bool = True,
    resume_timeout: float | None = None,
) -> LiveKitRecording:
    """Record ``session`` into turnlog as ``fleet``'s session ``session_id`` (keyed
    ``"<fleet>:<session_id>"``, ``recording.recorded.session_id``: the key the store, the API and
    ``turnlog forget`` name it by); call it before ``session.start(agent, ...)``.

    With ``resume`` (the default), a session turnlog already has is resumed
    (:meth:`SessionRecorder.resume`: the resume barrier, a new epoch) and its
    stored turns are added to ``agent``'s ``ChatContext`` and to
    ``session.history`` (:func:`chat_context_from_turns`); a session it does not
    have is started (``agent_id``, ``metadata``). ``resume=False``
    always starts it. The resume waits at the barrier, for a new session too,
    until the pipeline has applied what the session's partition holds: at most
    ``resume_timeout`` seconds (default ``settings.resume_timeout_seconds``).

    ``recorder``: a started :class:`SessionRecorder` to record through (the
    caller closes it). Without one, a recorder is made from ``settings``
    (default: the environment, ``TURNLOG_*``) and ``resume_source`` (default:
    turnlog's API at ``TURNLOG_API_URL``; on a host that holds the store,
    ``StoreResumeSource(settings)`` from ``turnlog.resume_barrier``), started,
    and closed when the recording stops.

    Raises:
        SessionClosedError: the session has ended in turnlog (it cannot be resumed).
        ResumeBarrierTimeout: the pipeline did not catch up in time (retry later).
        ConfigurationError: ``resume`` with a recorder that has no resume source.
        InvalidTurnError, SpoolError, RecorderError: as :meth:`SessionRecorder.start_session`.
    """
    owned = recorder is None
    if recorder is None:
        recorder = await SessionRecorder(settings, resume_source=resume_source).start()
    try:
        opened = await open_or_resume(recorder, session_id, fleet=fleet, agent_id=agent_id, metadata=metadata,
                                      resume=resume, resume_timeout=resume_timeout)
        recorded, resumed = opened.recorded, opened.resumed
        restored: list[ChatItem] = []
        if resumed and recorded.turns:
            restored = _items(recorded.turns)
            context = agent.chat_ctx.copy()
            context.insert(restored)
            await agent.update_chat_ctx(context)
            session.history.insert(restored)
    except BaseException:
        if owned:
            await recorder.close()
        raise
    recorded.set_trace_attributes(_job_ids(recorded))
    recording = LiveKitRecording(session, recorded, recorder, owns_recorder=owned, resumed=resumed, restored=restored)
    recording._attach()
    return recording


_ID_PREFIX = "turnlog_"


def _job_ids(recorded: RecordedSession) -> dict[str, str]:
    """The running job's room sid and job id as trace attributes (none outside a job)."""
    job_context = get_job_context(required=False)
    if job_context is None:
        return {}
    job = job_context.job
    room_sid = getattr(getattr(job, "room", None), "sid", None)
    return framework_ids({ROOM_SID_ATTRIBUTE: room_sid, CONVERSATION_ID_ATTRIBUTE: room_sid,
                          JOB_ID_ATTRIBUTE: getattr(job, "id", None)}, beside=recorded.trace_attributes)


def chat_context_from_turns(turns: Iterable[StoredTurn], *, base: ChatContext | None = None) -> ChatContext:
    """A ``ChatContext``: ``base``'s items (copied; none if None) and one ``ChatMessage``
    per stored turn of speaker ``"user"`` or ``"assistant"``, in ``turn_index`` order.

    A message's id is ``turnlog_<turn_index>``; ``interrupted`` is True for a turn
    cut by barge-in (``barged_in``) and for one left unfinished by a crash
    (status ``partial`` or ``interrupted``). ``created_at`` is the turn's start
    (epoch seconds), raised where needed so the messages stay in turn order
    (LiveKit keeps a context sorted by ``created_at``). Turns of other speakers,
    turns with no text and turns kept out of the LLM's context
    (``StoredTurn.in_context`` False: ``say(..., add_to_chat_ctx=False)``) are left out.
    An assistant turn's tool calls come before its message, each a ``FunctionCall``
    (id ``turnlog_<turn_index>_<n>_call``, the arguments as JSON) and its ``FunctionCallOutput`` (``is_error`` for a
    result stored as ``{"error": text}``).
    """
    context = base.copy() if base is not None else ChatContext.empty()
    context.insert(_items(turns))
    return context


#: What a rebuilt context holds: messages, and the tool calls and outputs before an assistant's message.
ChatItem = ChatMessage | FunctionCall | FunctionCallOutput


def _items(turns: Iterable[StoredTurn]) -> list[ChatItem]:
    items: list[ChatItem] = []
    created_at = float("-inf")
    for turn in conversation(turns, unfinished=True):
        if not turn.in_context:
            continue
        role = _ROLES[turn.speaker]
        created_at = max(turn.started_at.timestamp(), created_at + 1e-6)
        for number, call in enumerate(turn.tool_calls or () if role == "assistant" else ()):
            if call.get("result") is None:  # no output (LiveKit 1.6): its history holds neither
                continue
            call_id = f"{_ID_PREFIX}{turn.turn_index}_{number}"
            name = str(call.get("name", ""))
            items.append(FunctionCall(id=f"{call_id}_call", call_id=call_id, name=name,
                                      arguments=json.dumps(call.get("arguments") or {}), created_at=created_at))
            created_at += 1e-6
            output, is_error = _tool_output(call.get("result"))
            items.append(FunctionCallOutput(id=f"{call_id}_output", call_id=call_id, name=name, output=output,
                                            is_error=is_error, created_at=created_at))
            created_at += 1e-6
        items.append(
            ChatMessage(
                id=f"{_ID_PREFIX}{turn.turn_index}",
                role=role,
                content=[turn.text],
                interrupted=turn.barged_in or turn.status != TurnStatus.COMPLETE,
                created_at=created_at,
            )
        )
    return items


def _tool_result(output: FunctionCallOutput | None) -> Any:
    """A tool call's result as turnlog stores it: LiveKit's output text, ``{"error": text}`` for
    a tool that raised, None for a call with no output (``StopResponse``, LiveKit 1.6)."""
    if output is None:
        return None
    return {"error": output.output} if output.is_error else output.output


def _tool_output(result: Any) -> tuple[str, bool]:
    """:func:`_tool_result` read back: LiveKit's ``(output, is_error)``."""
    if isinstance(result, dict) and set(result) == {"error"}:
        return str(result["error"]), True
    if result is None:
        return "", False
    return result if isinstance(result, str) else json.dumps(result), False


# -- the writer's operations ---------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Partial:
    turn_index: int
    speaker: str
    text: str
    started_at: dt.datetime


@dataclass(frozen=True, slots=True)
class _Complete:
    turn_index: int
    speaker: str
    text: str
    started_at: dt.datetime
    ended_at: dt.datetime
    input_tokens: int = 0
    output_tokens: int = 0
    barged_in: bool = False
    #: the speech of an assistant turn (LiveKit's ``SpeechHandle.id``), for its span
    speech_id: str | None = None
    #: an assistant turn's tool calls: those LiveKit ran since the assistant turn before it
    tool_calls: tuple[ToolCall, ...] = ()
    #: False: spoken, but kept out of LiveKit's chat context (``say(..., add_to_chat_ctx=False)``)
    in_context: bool = True


@dataclass(frozen=True, slots=True)
class _SpoolPartials:
    """Spool the open turns' newest text now (the end of an agent text segment)."""


@dataclass(frozen=True, slots=True)
class _End:
    reason: str
    ended_at: dt.datetime


@dataclass(frozen=True, slots=True)
class _Stop:
    """The last operation (nothing to record): then the writer closes an owned recorder and stops."""


_Operation = _Partial | _Complete | _SpoolPartials | _End | _Stop


# -- open turns ------------------------------------------------------------------------
@dataclass(slots=True)
class _UserTurn:
    turn_index: int
    started_at: dt.datetime
    finals: list[str] = field(default_factory=list)
    interim: str = ""
    #: the speeches created while the turn was open (a preemptive reply may carry its message)
    speeches: list[SpeechHandle] = field(default_factory=list)
    #: True once its partial text was handed to the recorder (then it must be completed)
    recorded: bool = False

    @property
    def text(self) -> str:
        return " ".join(part for part in (s.strip() for s in (*self.finals, self.interim)) if part)


@dataclass(slots=True)
class _EndedTurn:
    """A user turn LiveKit ended (its end of turn) whose message it has not committed yet.

    LiveKit commits it, if at all, in ``task`` (``AgentActivity._user_turn_completed_task``,
    which runs ``on_user_turn_completed``) or in a reply speech ``task`` schedules for it:
    one it makes, or the preemptive one made while the user spoke (``_pipeline_reply_task``
    adds the message if the speech is scheduled, which ``AgentActivity._schedule_speech``
    marks at once). ``speeches`` are those candidates. Once the task is done and none of
    them was scheduled (or each scheduled one is done with no commit), LiveKit dropped
    the turn."""

    turn: _UserTurn
    task: asyncio.Task[Any]
    speeches: list[SpeechHandle]


@dataclass(slots=True)
class _AgentTurn:
    turn_index: int
    started_at: dt.datetime
    speech_id: str | None
    text: str = ""


class _TranscriptTap(TextOutput):
    """The session's text output when it has none: the agent's text goes to the recording."""

    def __init__(self, recording: LiveKitRecording) -> None:
        super().__init__(label="turnlog", next_in_chain=None)
        self._recording = recording

    async def capture_text(self, text: str) -> None:
        self._recording._on_agent_text(text)

    def flush(self) -> None:
        self._recording._on_agent_flush()


class _Watch:
    """The last ``TextOutput`` of the session's transcription chain, watched: its
    ``capture_text`` and ``flush`` (set on the instance) tell the recording, then do
    what they did. The last link receives the text as the room is sent it: after
    LiveKit's ``TranscriptSynchronizer`` (``voice/transcription/synchronizer.py``),
    which releases the text of a reply as its audio plays, so what it gets is what
    was spoken (a text-only session has no synchronizer: the text as generated)."""

    def __init__(self, recording: LiveKitRecording, output: TextOutput) -> None:
        self.output = output
        capture_text, flush = output.capture_text, output.flush

        async def watched_capture_text(text: str) -> None:
            recording._on_agent_text(text)
            await capture_text(text)

        def watched_flush() -> None:
            recording._on_agent_flush()
            flush()

        setattr(output, "capture_text", watched_capture_text)  # noqa: B010 (an instance attribute, by design)
        setattr(output, "flush", watched_flush)  # noqa: B010

    def release(self) -> None:
        """Give the output back its own methods."""
        for name in ("capture_text", "flush"):
            vars(self.output).pop(name, None)


class _EndOfTurnWatch:
    """The session's ``AgentActivity`` watched where LiveKit ends the user's turn: the
    ``on_end_of_turn`` hook its ``AudioRecognition`` calls (``voice/audio_recognition.py``,
    ``_bounce_eou_task``; set on the instance, it still does what it did). When the hook
    returns True, the recognition clears its transcript: the next words the user says
    begin a new turn, whatever becomes of this one (``AgentActivity.on_end_of_turn``
    starts ``_user_turn_completed_task``, which commits the user's message, or drops it:
    ``StopResponse`` from ``on_user_turn_completed``, an uninterruptible speech playing)."""

    def __init__(self, recording: LiveKitRecording, activity: Any) -> None:
        self.activity = activity
        on_end_of_turn = activity.on_end_of_turn

        def watched_on_end_of_turn(info: Any) -> bool:
            before = getattr(activity, "_user_turn_completed_atask", None)
            ended: bool = on_end_of_turn(info)
            if ended:
                try:
                    recording._on_user_turn_ended(activity, before)
                except Exception as e:  # a bug here must not stop LiveKit's turn handling
                    logger.error("session %s: the end of a user turn not followed: %s", recording.recorded.session_id,
                                 type(e).__name__)
            return ended

        setattr(activity, "on_end_of_turn", watched_on_end_of_turn)  # noqa: B010 (an instance attribute, by design)

    def release(self) -> None:
        """Give the activity back its own hook."""
        vars(self.activity).pop("on_end_of_turn", None)


class LiveKitRecording:
    """One ``AgentSession`` being recorded into turnlog; made by :func:`record_session`.

    ``recorded`` is the turnlog session (its ``turns`` are the stored ones after
    a resume), ``resumed`` whether it was resumed, ``restored`` the items (messages,
    tool calls and their outputs) rebuilt from it (already in the agent's ``ChatContext`` and in
    ``session.history``). ``failures`` counts recorder calls that failed (each
    is logged at ERROR with its reason); the recording goes on after one.
    """

    def __init__(
        self,
        session: AgentSession,
        recorded: RecordedSession,
        recorder: SessionRecorder,
        *,
        owns_recorder: bool,
        resumed: bool = False,
        restored: Iterable[ChatItem] = (),
    ) -> None:
        self.session = session
        self.recorded = recorded
        self.recorder = recorder
        self.resumed = resumed
        self.restored = tuple(restored)
        self._owns_recorder = owns_recorder
        self._next_index = recorded.next_turn_index
        self._user: _UserTurn | None = None
        self._agent: _AgentTurn | None = None
        self._ended: list[_EndedTurn] = []
        self._usage_seen: dict[tuple[str, str], tuple[int, int]] = {}
        #: LLM tokens not yet given to a turn, by the speech LiveKit made the call for (None: no speech)
        self._usage: dict[str | None, PendingUsage] = {}
        self._usage_speech: str | None = None
        self._live_speeches: set[str] = set()
        self._writer: OrderedWriter[_Operation] = OrderedWriter(
            recorded.session_id, self._apply, name=f"turnlog-livekit-{recorded.session_id}",
            on_stop=self._on_writer_stop,
        )
        self._stopping = False
        self._stop_requested = asyncio.Event()
        self._watch: _Watch | None = None
        self._turn_watch: _EndOfTurnWatch | None = None
        self._finished_speeches: set[str] = set()
        #: tool calls LiveKit ran, not yet given to an assistant turn
        self._tool_calls = PendingToolCalls()

    # -- public ------------------------------------------------------------------
    @property
    def failures(self) -> int:
        """Recorder calls that failed (each logged at ERROR, by session and operation)."""
        return self._writer.failures

    @property
    def closed(self) -> bool:
        """True once the writer has made every queued call and stopped."""
        return self._writer.closed

    async def wait_recorded(self) -> None:
        """Until every event seen so far has been handed to the recorder (each
        turn completion returns as :meth:`RecordedSession.complete_turn` does)."""
        await self._writer.drained()

    async def wait_closed(self, timeout: float | None = None) -> bool:
        """Until the recording stopped (after the session's ``close``, or :meth:`aclose`);
        False if ``timeout`` seconds passed first."""
        return await self._writer.wait_closed(timeout)

    async def aclose(self) -> None:
        """Stop recording without ending the session (it stays resumable): make the
        queued calls, then close the recorder if this recording made it."""
        self._stop()
        await self._writer.wait_closed()

    # -- wiring ------------------------------------------------------------------
    def _attach(self) -> None:
        self.session.on("user_input_transcribed", self._on_user_input_transcribed)
        self.session.on("conversation_item_added", self._on_conversation_item_added)
        self.session.on("session_usage_updated", self._on_session_usage_updated)
        self.session.on("agent_state_changed", self._on_agent_state_changed)
        self.session.on("user_state_changed", self._on_user_state_changed)
        self.session.on("speech_created", self._on_speech_created)
        self.session.on("function_tools_executed", self._on_function_tools_executed)
        self.session.on("close", self._on_close)
        # AgentSession.on warns that metrics_collected is deprecated (for usage and latency);
        # it is listened to only for the speech an LLM call was made for (LLMMetrics.speech_id).
        super(AgentSession, self.session).on("metrics_collected", self._on_metrics_collected)
        # Before start, a transcription output may still be set by RoomIO: only an
        # existing one is wrapped now; the agent's handoff (start) wraps again.
        self._tap_transcription(install=self.session.agent_state != "initializing")
        job = get_job_context(required=False)
        if job is not None:
            job.add_shutdown_callback(self._on_job_shutdown)

    def _detach(self) -> None:
        self.session.off("user_input_transcribed", self._on_user_input_transcribed)
        self.session.off("conversation_item_added", self._on_conversation_item_added)
        self.session.off("session_usage_updated", self._on_session_usage_updated)
        self.session.off("agent_state_changed", self._on_agent_state_changed)
        self.session.off("user_state_changed", self._on_user_state_changed)
        self.session.off("speech_created", self._on_speech_created)
        self.session.off("close", self._on_close)
        self.session.off("metrics_collected", self._on_metrics_collected)
        if self._watch is not None:
            self._watch.release()
            self._watch = None
        if self._turn_watch is not None:
            self._turn_watch.release()
            self._turn_watch = None

    def _tap_transcription(self, *, install: bool) -> None:
        """Watch the last link of ``session.output.transcription`` unless it is watched
        already (:class:`_Watch`); with ``install``, give a session without one a
        :class:`_TranscriptTap`."""
        last = self.session.output.transcription
        if last is None:
            if install:
                self.session.output.transcription = last = _TranscriptTap(self)
            else:
                return
        while last.next_in_chain is not None:
            last = last.next_in_chain
        if isinstance(last, _TranscriptTap) or (self._watch is not None and self._watch.output is last):
            return
        if self._watch is not None:
            self._watch.release()
        self._watch = _Watch(self, last)

    def _watch_end_of_turn(self) -> None:
        """Watch the current activity's end-of-turn hook (:class:`_EndOfTurnWatch`), unless
        it is watched already; an agent's handoff makes a new activity."""
        activity = getattr(self.session, "_activity", None)
        if activity is None or not all(hasattr(activity, name) for name in ("on_end_of_turn",
                                                                            "_user_turn_completed_atask")):
            return  # a release without them: user turns end only at their commit
        if self._turn_watch is not None:
            if self._turn_watch.activity is activity:
                return
            self._turn_watch.release()
        self._turn_watch = _EndOfTurnWatch(self, activity)

    def _transcribed_by_realtime_model(self) -> bool:
        """True when a realtime model transcribes the user (LiveKit then ignores the STT:
        ``AgentActivity.on_final_transcript``); its transcript may come after its reply."""
        activity = getattr(self.session, "_activity", None)
        model = getattr(activity, "llm", None) if activity is not None else self.session.llm
        return isinstance(model, RealtimeModel) and model.capabilities.user_transcription

    async def _on_job_shutdown(self) -> None:
        """The job ends: LiveKit closes the session (``job_shutdown``, not ended in
        turnlog) at the same time; wait for that close to be recorded, then stop."""
        if self.session.agent_state != "initializing" and not self._stopping:
            wait = self.recorder.settings.spool_close_timeout_seconds
            try:
                await asyncio.wait_for(self._stop_requested.wait(), wait)
            except TimeoutError:
                logger.warning("session %s: no close from LiveKit within %.0f s of the job's shutdown",
                               self.recorded.session_id, wait)
        await self.aclose()

    # -- LiveKit callbacks (synchronous) ----------------------------------------
    def _on_user_input_transcribed(self, ev: UserInputTranscribedEvent) -> None:
        if self._stopping:
            return
        turn = self._user
        if turn is None:
            if not ev.transcript.strip():
                return
            turn = self._user = _UserTurn(self._take_index(), _from_epoch(ev.created_at))
        elif not ev.transcript.strip() and not turn.text:
            return  # opened by the user's speech; no words yet
        if ev.is_final:
            turn.finals.append(ev.transcript)
            turn.interim = ""
        else:
            turn.interim = ev.transcript
        turn.recorded = True
        self._submit(_Partial(turn.turn_index, USER_SPEAKER, turn.text, turn.started_at))

    def _on_user_state_changed(self, ev: UserStateChangedEvent) -> None:
        """The user starts speaking: their turn opens now, with no text yet, so it is
        indexed before a reply it prompts. A realtime model may send the transcript
        after its reply (LiveKit back-dates the user message: ``voice/agent_activity.py``,
        ``AgentActivity._on_input_audio_transcription_completed``), and the turn
        index must follow the conversation's order, not the transcript's."""
        if self._stopping or ev.new_state != "speaking" or self._user is not None:
            return
        self._user = _UserTurn(self._take_index(), _from_epoch(ev.created_at))

    def _on_agent_text(self, delta: str) -> None:
        if self._stopping or not delta:
            return
        speech = self.session.current_speech
        speech_id = speech.id if speech is not None else None
        if speech_id in self._finished_speeches:
            return  # released by the synchronizer after its message was committed
        turn = self._agent
        if turn is None or (speech_id is not None and turn.speech_id is not None and speech_id != turn.speech_id):
            self._release_untranscribed_user_turn()
            turn = self._agent = _AgentTurn(self._take_index(), _now(), speech_id)
            if speech is not None:
                speech.add_done_callback(self._on_speech_done)
        turn.text += delta
        self._submit(_Partial(turn.turn_index, AGENT_SPEAKER, turn.text, turn.started_at))

    def _on_speech_done(self, speech: SpeechHandle) -> None:
        """A speech is over. If its text opened the agent's turn and no assistant
        message committed it, LiveKit did not add it to the conversation: an
        interrupted speech none of which was played (nothing was heard: the turn
        is completed with no text, ``barged_in``), or one spoken in full with
        ``add_to_chat_ctx=False`` (completed with its text, ``in_context=False``: LiveKit's
        history and the LLM's context do not hold it, so a rebuilt context leaves it out)."""
        turn = self._agent
        if self._stopping or turn is None or turn.speech_id != speech.id:
            return
        self._agent = None
        self._finished_speeches.add(speech.id)
        input_tokens, output_tokens = self._take_usage(speech.id)
        text, barged_in = ("", True) if speech.interrupted else (turn.text, False)
        self._submit(
            _Complete(turn.turn_index, AGENT_SPEAKER, text, turn.started_at, _now(), input_tokens, output_tokens,
                      barged_in, speech_id=speech.id, in_context=False)
        )

    def _on_agent_flush(self) -> None:
        if not self._stopping and self._agent is not None:
            self._submit(_SpoolPartials())

    def _on_conversation_item_added(self, ev: ConversationItemAddedEvent) -> None:
        if self._stopping:
            return
        item = ev.item
        if isinstance(item, AgentHandoff):
            # Emitted as an agent's activity starts, after RoomIO set the outputs
            # and before any reply reads the text output.
            self._tap_transcription(install=True)
            self._watch_end_of_turn()
            return
        if not isinstance(item, ChatMessage):
            return
        now = _now()
        text = item.text_content or ""
        if item.role == "user":
            if self._tool_calls:  # no reply read them (StopResponse, no reply required): left out
                dropped = self._tool_calls.take()
                logger.info("session %s: %d tool call(s) with no reply are not recorded", self.recorded.session_id,
                            len(dropped))
            if self._ended:  # LiveKit commits the turns it ended in the order it ended them
                user: _UserTurn | None = self._ended.pop(0).turn
            else:
                user, self._user = self._user, None
            index = user.turn_index if user is not None else self._take_index()
            opened = user.started_at if user is not None else _from_epoch(item.created_at)
            started, ended = _span(item, opened, now)
            self._submit(_Complete(index, USER_SPEAKER, text, started, ended))
        elif item.role == "assistant":
            agent = self._agent
            self._agent = None
            if agent is not None and agent.speech_id is not None:
                self._finished_speeches.add(agent.speech_id)
            index = agent.turn_index if agent is not None else self._take_index()
            opened = agent.started_at if agent is not None else _from_epoch(item.created_at)
            started, ended = _span(item, opened, now)
            input_tokens, output_tokens = self._take_usage(agent.speech_id if agent is not None else None)
            self._submit(
                _Complete(index, AGENT_SPEAKER, text, started, ended, input_tokens, output_tokens,
                          barged_in=item.interrupted, speech_id=agent.speech_id if agent is not None else None,
                          tool_calls=self._tool_calls.take())
            )

    def _on_function_tools_executed(self, ev: FunctionToolsExecutedEvent) -> None:
        """The tools LiveKit ran for a reply: kept for the next assistant turn (the reply that
        reads their outputs), as LiveKit's history holds them before it."""
        if self._stopping:
            return
        outputs: list[FunctionCallOutput | None] = list(ev.function_call_outputs)
        for number, call in enumerate(ev.function_calls):
            self._tool_calls.call(call.call_id, call.name, call.arguments)
            self._tool_calls.result(call.call_id, _tool_result(outputs[number] if number < len(outputs) else None))

    def _on_metrics_collected(self, ev: MetricsCollectedEvent) -> None:
        """Emitted just before the ``session_usage_updated`` its metrics cause
        (``AgentActivity._on_metrics_collected``): the speech an LLM call was made for
        (``LLMMetrics.speech_id``, set from the speech running the call)."""
        metrics = ev.metrics
        self._usage_speech = metrics.speech_id if isinstance(metrics, LLMMetrics) else None

    def _on_session_usage_updated(self, ev: SessionUsageUpdatedEvent) -> None:
        speech_id, self._usage_speech = self._usage_speech, None
        pending = self._usage.setdefault(speech_id, PendingUsage())
        for usage in ev.usage.model_usage:
            if not isinstance(usage, LLMModelUsage):
                continue
            key = (usage.provider, usage.model)
            seen_in, seen_out = self._usage_seen.get(key, (0, 0))
            if usage.input_tokens < seen_in or usage.output_tokens < seen_out:
                seen_in, seen_out = 0, 0  # the session was started again: its totals restarted
            pending.add(usage.input_tokens - seen_in, usage.output_tokens - seen_out)
            self._usage_seen[key] = (usage.input_tokens, usage.output_tokens)

    def _on_agent_state_changed(self, _ev: object) -> None:
        if not self._stopping and self.session.agent_state != "initializing":
            self._tap_transcription(install=True)  # a transcription output replaced after start
            self._watch_end_of_turn()

    def _on_speech_created(self, ev: SpeechCreatedEvent) -> None:
        if self._stopping:
            return
        speech = ev.speech_handle
        self._live_speeches.add(speech.id)
        speech.add_done_callback(self._on_live_speech_done)
        if self._user is not None:
            self._user.speeches.append(speech)
        for ended in self._ended:
            if not ended.task.done():  # made by the task that decides the turn: it may carry its message
                ended.speeches.append(speech)

    def _on_live_speech_done(self, speech: SpeechHandle) -> None:
        self._live_speeches.discard(speech.id)

    def _on_user_turn_ended(self, activity: Any, task_before: asyncio.Task[Any] | None) -> None:
        """LiveKit ended the user's turn (:class:`_EndOfTurnWatch`): the open turn takes no
        more words. Its message comes with ``conversation_item_added``, or never
        (:meth:`_forget_if_committed`). A message LiveKit committed during the hook (a session closing)
        has completed the turn already."""
        turn = self._user
        if self._stopping or turn is None or self._transcribed_by_realtime_model():
            return  # a realtime model's transcript completes its turn, however late
        self._user = None
        task = getattr(activity, "_user_turn_completed_atask", None)
        if not isinstance(task, asyncio.Task) or task is task_before or task.done():
            self._drop_user_turn(turn)  # no task: LiveKit skipped the turn (speech scheduling paused)
            return
        ended = _EndedTurn(turn, task, list(turn.speeches))
        self._ended.append(ended)
        task.add_done_callback(lambda _task: self._forget_if_committed(ended))

    def _forget_if_committed(self, ended: _EndedTurn) -> None:
        """Drop ``ended`` once LiveKit can no longer commit its message: its task is done,
        and no speech that may carry the message was scheduled, or each scheduled one is
        done (:class:`_EndedTurn`)."""
        if self._stopping or ended not in self._ended or not ended.task.done():
            return
        for speech in ended.speeches:
            if speech.scheduled and not speech.done():
                speech.add_done_callback(lambda _speech: self._forget_if_committed(ended))
                return
        self._ended.remove(ended)
        self._drop_user_turn(ended.turn)

    def _drop_user_turn(self, turn: _UserTurn) -> None:
        """LiveKit dropped the turn: its history holds nothing of it. A turn whose partial
        text was recorded is completed with no text (left out of a rebuilt context); one
        with none is not recorded at all."""
        if turn.recorded:
            self._submit(_Complete(turn.turn_index, USER_SPEAKER, "", turn.started_at, _now()))
        else:
            self._release_index(turn.turn_index)

    def _release_untranscribed_user_turn(self) -> None:
        """The agent's turn opens while the user's open turn has no words and the user is
        not speaking (noise, or speech the STT did not transcribe): LiveKit holds no words
        of it and did not end it (``_bounce_eou_task`` waits for a transcript), so any words
        the user says later are committed after this agent turn. The user's turn gives up
        its index, unless a realtime model transcribes the user after its reply."""
        user = self._user
        if (user is None or user.recorded or self.session.user_state == "speaking"
                or self._transcribed_by_realtime_model()):
            return
        self._user = None
        self._release_index(user.turn_index)
    def _on_close(self, ev: CloseEvent) -> None:
        if self._stopping:
            return
        if ev.reason in ENDING_REASONS and not (ev.reason == CloseReason.USER_INITIATED and _closed_by_job_shutdown()):
            self._submit(_End(ev.reason.value, _from_epoch(ev.created_at)))
        else:
            logger.info("session %s: LiveKit closed it (%s); it stays resumable", self.recorded.session_id,
                        ev.reason.value)
        self._stop()

    # -- internals -----------------------------------------------------------------
    def _take_index(self) -> int:
        index = self._next_index
        self._next_index += 1
        return index

    def _release_index(self, index: int) -> None:
        """An index taken for a turn that was never recorded: given back if no later one
        was taken (else it is left unused)."""
        if index == self._next_index - 1:
            self._next_index = index

    def _take_usage(self, speech_id: str | None) -> tuple[int, int]:
        """The tokens an assistant turn of ``speech_id`` gets: its speech's LLM calls', and
        those of no speech or of a speech that is over (reported after its turn completed,
        or of one that completed no turn); a speech still running keeps its own."""
        taken = PendingUsage()
        for key in list(self._usage):
            if key == speech_id or key is None or key not in self._live_speeches:
                taken.add(*self._usage.pop(key).take())
        return taken.take()

    def _submit(self, operation: _Operation) -> None:
        self._writer.put(operation)

    def _stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._stop_requested.set()
        self._detach()
        self._writer.put(_Stop(), last=True)

    async def _apply(self, operation: _Operation) -> None:
        """Make the recorder call ``operation`` stands for (the writer's ``apply``)."""
        session = self.recorded
        if isinstance(operation, _Partial):
            session.update_partial(operation.turn_index, operation.speaker, operation.text,
                                   started_at=operation.started_at)
        elif isinstance(operation, _Complete):
            await session.complete_turn(
                operation.turn_index,
                operation.speaker,
                operation.text,
                started_at=operation.started_at,
                ended_at=operation.ended_at,
                input_tokens=operation.input_tokens,
                output_tokens=operation.output_tokens,
                barged_in=operation.barged_in,
                tool_calls=operation.tool_calls or None,
                in_context=operation.in_context,
                trace_attributes=framework_ids({SPEECH_ID_ATTRIBUTE: operation.speech_id},
                                               beside=session.trace_attributes) or None,
            )
        elif isinstance(operation, _SpoolPartials):
            await session.flush_partial()
        elif isinstance(operation, _End):
            await session.end(operation.reason, ended_at=operation.ended_at)

    async def _on_writer_stop(self) -> None:
        if self._owns_recorder:
            await self.recorder.close()


def _closed_by_job_shutdown() -> bool:
    """True when the running close is LiveKit's job shutdown, not the app's.

    At a job's shutdown (a drain timeout, ``ctx.shutdown()``, a crashed
    entrypoint, the room gone), LiveKit's job process closes the primary session
    with ``session.aclose()`` before the shutdown callbacks run
    (``livekit/agents/ipc/job_proc_lazy_main.py``, ``_JobProc._shutdown_job``:
    ``asyncio.wait_for(session.aclose(), ...)`` in the job's task), and
    ``aclose()`` closes with ``USER_INITIATED`` (``AgentSession.aclose``), the
    reason an app's own close has. ``CloseEvent`` is emitted in the closing
    task: the job's task (``job_task``) or, where ``asyncio.wait_for`` runs its
    awaitable in a task of its own (Python 3.11), a task the job's task is
    waiting for. An app's close in a task of its own (``asyncio.create_task(
    session.aclose())`` from a tool, its own ``wait_for``) is neither.
    """
    task = asyncio.current_task()
    if task is None:
        return False
    if task.get_name() == _JOB_TASK_NAME:
        return True
    job = next((other for other in asyncio.all_tasks() if other.get_name() == _JOB_TASK_NAME), None)
    return job is not None and _awaits(job, task)


def _awaits(waiting: asyncio.Task[Any], task: asyncio.Task[Any]) -> bool:
    """True when suspended ``waiting`` is awaiting ``task``: down its chain of awaits
    (``cr_await``), a link is ``task`` itself, or is a ``wait_for`` coroutine holding ``task``
    as the awaitable it runs (its local ``fut``: Python 3.11's ``asyncio.wait_for``, and
    ``wait_for2.wait_for``, which Pipecat installs as ``asyncio.wait_for`` on Python < 3.12).
    Other locals are not looked at: LiveKit's job task holds the entrypoint's task in some
    while it waits."""
    awaited: Any = waiting.get_coro()
    for _ in range(_MAX_AWAIT_DEPTH):
        if awaited is None:
            return False
        if awaited is task:
            return True
        frame = getattr(awaited, "cr_frame", None)
        if frame is not None and frame.f_code.co_name == "wait_for" and frame.f_locals.get("fut") is task:
            return True
        awaited = getattr(awaited, "cr_await", None)
    return False


#: Coroutines followed down a task's chain of awaits (LiveKit's job task: a few).
_MAX_AWAIT_DEPTH = 32


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _from_epoch(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _span(message: ChatMessage, opened: dt.datetime, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """A committed turn's (started_at, ended_at): LiveKit's speaking times in the
    message's metrics when it has them, else when the turn opened and now."""
    metrics: Mapping[str, Any] = message.metrics or {}
    began, stopped = metrics.get("started_speaking_at"), metrics.get("stopped_speaking_at")
    started = _from_epoch(began) if isinstance(began, (int, float)) and not isinstance(began, bool) else opened
    ended = _from_epoch(stopped) if isinstance(stopped, (int, float)) and not isinstance(stopped, bool) else now
    return started, max(started, ended)
