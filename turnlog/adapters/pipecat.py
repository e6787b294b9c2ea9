"""Pipecat adapter: a pipecat-ai 1.x (>=1.5) pipeline records its conversation through turnlog.

Usage (inside ``async with SessionRecorder() as recorder:``)::

    from turnlog.adapters.pipecat import TurnlogObserver

    observer = await TurnlogObserver.open(recorder, "call-42", fleet="support", agent_id="bot-7")
    context = LLMContext([SYSTEM_PROMPT, *observer.messages])      # the stored conversation, after a crash
    aggregators = LLMContextAggregatorPair(context)
    worker = PipelineWorker(Pipeline([transport.input(), stt, aggregators.user(), llm, tts,
                                      transport.output(), aggregators.assistant()]))
    observer.attach(worker, aggregators)
    await WorkerRunner().run(worker)

What is recorded, and from where (Pipecat's ``TranscriptProcessor`` is gone
since 1.0, so this is an observer plus the aggregators' events):

- **User turns.** The :class:`InterimTranscriptionFrame` and
  :class:`TranscriptionFrame` frames the user aggregator processes give the
  open user turn's partial text (the final segments so far, then the current
  interim one); ``on_user_turn_message_added`` completes it with the text the
  aggregator wrote to the LLM context. Frames the aggregator's mute filter
  drops (``user_mute_strategies``; ``LLMUserAggregator._maybe_mute_frame``)
  are skipped: the observer follows the mute state from the
  :class:`UserMuteStartedFrame` / :class:`UserMuteStoppedFrame` the
  aggregator broadcasts. An interim frame carrying OpenAI Realtime's
  ``ConversationItemInputAudioTranscriptionDelta`` is a delta, added to the
  interim text before it; any other interim frame replaces it.
- **Typed and injected user turns.** A user message written to the context
  from an :class:`LLMMessagesAppendFrame` the user aggregator processes is a
  user turn of its own: ``kind="typed"`` when an ``RTVIProcessor`` pushed the
  frame (a client's ``send-text``), else ``kind="injected"``.
- **Tool calls.** :class:`FunctionCallInProgressFrame`,
  :class:`FunctionCallResultFrame` (final results only) and
  :class:`FunctionCallCancelFrame` (for calls Pipecat cancels:
  ``cancel_on_interruption``) reaching the assistant aggregator: the calls of
  one LLM response are one assistant turn with no text, taking its index when
  the first call starts (when Pipecat writes it to its context) and completed
  once every call ended; a cancelled call's result is :data:`CANCELLED`.
- **Realtime services.** Once a service announced ``is_realtime_service``
  (its :class:`LLMServiceMetadataFrame`), Pipecat writes the user's message to
  the context when the response starts, and the transcript may come later: a
  user turn begun (a ``UserStartedSpeakingFrame`` the user aggregator
  processes, or pushes when its turn strategies start the turn, as on OpenAI
  Realtime's ``ProposedUserStartedSpeakingFrame`` from Pipecat 1.8) and not
  yet written then takes its turn index before the response's.
- **Assistant turns.** The :class:`LLMTextFrame` / :class:`TTSTextFrame`
  frames the assistant aggregator processes (with a TTS, the words the output
  transport released as they were spoken) give the open assistant turn's
  partial text; ``on_assistant_turn_stopped`` completes it with the
  aggregator's text. ``AssistantTurnStoppedMessage.interrupted`` after an
  :class:`InterruptionFrame` (the user barged in) is recorded as
  ``barged_in=True`` with the words spoken. A turn stopped by a
  :class:`CancelFrame` is left open with its words, so the end of the session
  keeps it ``interrupted`` (cut off by the hang-up, not by the user).
- **Tokens.** :class:`LLMUsageMetricsData` in the :class:`MetricsFrame`
  frames reaching the assistant aggregator (``PipelineParams(enable_metrics=True,
  enable_usage_metrics=True)``): input tokens gross of the prompt cache (see
  :func:`input_tokens`) and ``completion_tokens``, summed over the LLM calls
  since the last assistant turn, recorded on the next completed assistant turn.
- **Traces.** Every completed turn's span carries Pipecat's conversation id
  under Pipecat's own key ``conversation.id`` (its ``conversation`` and ``turn``
  spans, ``pipecat/utils/tracing/turn_trace_observer.py``): the worker's
  ``conversation_id``, else the one Pipecat made up when the worker has
  ``enable_tracing=True``. A no-op when turnlog's tracing is off.
- **The end.** The worker's ``on_pipeline_finished`` ends the session when its
  frame is one of ``end_on`` (default :class:`EndFrame` -> ``"completed"``,
  :class:`CancelFrame` -> ``"cancelled"``). A :class:`StopFrame`, or a process
  that dies, leaves the session active and resumable.

Order: observer callbacks and aggregator events run in different asyncio
tasks, so each callback only puts a typed item on one queue, in the order
Pipecat produced them (an observer is told about a frame when the
aggregator starts processing it, before the aggregator fires the event
that frame causes), and one writer task (:class:`turnlog.adapters._core.OrderedWriter`)
makes the recorder calls in that order. Speakers are ``"user"`` and ``"assistant"``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

try:
    from pipecat.frames.frames import (
        AggregatedTextFrame,
        CancelFrame,
        EndFrame,
        Frame,
        FunctionCallCancelFrame,
        FunctionCallInProgressFrame,
        FunctionCallResultFrame,
        InterimTranscriptionFrame,
        LLMFullResponseStartFrame,
        LLMMessagesAppendFrame,
        LLMServiceMetadataFrame,
        LLMTextFrame,
        MetricsFrame,
        TranscriptionFrame,
        TTSTextFrame,
        UserMuteStartedFrame,
        UserMuteStoppedFrame,
        UserStartedSpeakingFrame,
    )
    from pipecat.metrics.metrics import LLMTokenUsage, LLMUsageMetricsData
    from pipecat.observers.base_observer import BaseObserver, FrameProcessed, FramePushed
    from pipecat.processors.frame_processor import FrameDirection
    from pipecat.processors.frameworks.rtvi import RTVIProcessor
    from pipecat.utils.string import TextPartForConcatenation, concatenate_aggregated_text
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "turnlog.adapters.pipecat needs pipecat-ai>=1.5,<2: pip install 'turnlog[pipecat]'"
    ) from e

try:  # OpenAI Realtime's event types (pydantic models; no network client needed)
    from pipecat.services.openai.realtime.events import ConversationItemInputAudioTranscriptionDelta

    _DELTA_EVENTS: tuple[type, ...] = (ConversationItemInputAudioTranscriptionDelta,)
except ImportError:  # pragma: no cover - a Pipecat without the module
    _DELTA_EVENTS = ()

from turnlog.adapters._core import (
    ASSISTANT,
    USER,
    OrderedWriter,
    PendingToolCalls,
    PendingUsage,
    framework_ids,
    open_or_resume,
)
from turnlog.producers import RecordedSession, RecorderError, SessionRecorder, StoredTurn
from turnlog.schemas import TurnKind

__all__ = [
    "ASSISTANT",
    "CANCELLED",
    "CONVERSATION_ID_ATTRIBUTE",
    "END_REASONS",
    "USER",
    "TurnlogObserver",
    "conversation_id",
    "history_messages",
    "input_tokens",
]

logger = logging.getLogger(__name__)

#: What ``on_pipeline_finished`` ends the session with, by the type of its frame.
END_REASONS: Mapping[type[Frame], str] = {EndFrame: "completed", CancelFrame: "cancelled"}
#: The frames Pipecat's user aggregator drops while the user is muted
#: (``LLMUserAggregator._maybe_mute_frame``) that this adapter records from.
_MUTED_FRAMES = (InterimTranscriptionFrame, TranscriptionFrame, UserStartedSpeakingFrame)
#: The trace attribute of the recorder's turn spans that holds Pipecat's conversation id: the
#: key Pipecat's own ``conversation`` and ``turn`` spans use (``TurnTraceObserver``).
CONVERSATION_ID_ATTRIBUTE = "conversation.id"


def conversation_id(worker: Any) -> str | None:
    """Pipecat's conversation id of ``worker`` (a ``PipelineWorker``, or a ``PipelineTask``
    of an older Pipecat): the ``conversation_id`` it was given, else the one its turn trace
    observer made up when the pipeline started (``enable_tracing=True``); None if neither
    (tracing off and no id given, or not started yet). Both are read with ``getattr``:
    Pipecat keeps the given id in a private attribute (``_conversation_id``, as 1.14's
    ``PipelineWorker`` does), and a release that keeps it elsewhere gives None, never an error."""
    given = getattr(worker, "_conversation_id", None)
    if isinstance(given, str) and given:
        return given
    observer = getattr(worker, "turn_trace_observer", None)
    made_up = getattr(observer, "_conversation_id", None)
    return made_up if isinstance(made_up, str) and made_up else None


def input_tokens(usage: LLMTokenUsage) -> int:
    """The input tokens of one LLM call, gross of the prompt cache: every token the model read.

    Pipecat's ``LLMTokenUsage`` (``pipecat/metrics/metrics.py``) has
    ``prompt_tokens`` net of the cache on Anthropic and Bedrock and gross on
    OpenAI-compatible services, while ``total_tokens`` is gross on all of them:
    so this is ``total_tokens - completion_tokens``. A service that reports no
    usable total (``total_tokens`` below ``prompt_tokens + completion_tokens``)
    gives ``prompt_tokens``.
    """
    prompt, completion, total = usage.prompt_tokens or 0, usage.completion_tokens or 0, usage.total_tokens or 0
    return total - completion if total >= prompt + completion else prompt


#: What a tool call cancelled by the user speaking holds as its result (Pipecat writes
#: ``"CANCELLED"`` as the tool message's content: ``LLMAssistantAggregator._handle_function_call_cancel``).
CANCELLED: Mapping[str, bool] = {"cancelled": True}
#: The prefix of the tool call ids of a rebuilt context (Pipecat's own ids are not stored).
_CALL_ID_PREFIX = "turnlog_"


def history_messages(turns: Iterable[StoredTurn]) -> list[dict[str, Any]]:
    """The stored turns as LLM context messages, in ``turn_index`` order, as Pipecat's
    context aggregators write them.

    A turn of speaker ``"user"`` or ``"assistant"`` with text is
    ``{"role": "user" | "assistant", "content": text}`` (a typed or injected user turn
    too: Pipecat holds those as user messages). A predecessor's unfinished
    (``partial`` / ``interrupted``) turn is included: those are the words already
    said or heard before the crash. An assistant turn's tool calls come before its
    text (its text may be empty), each as Pipecat's ``FunctionCallInProgressFrame``
    handling writes it: ``{"role": "assistant", "tool_calls": [{"id", "function":
    {"name", "arguments"}, "type": "function"}]}`` (the arguments as JSON; the id
    ``turnlog_<turn_index>_<n>``, Pipecat's own is not stored), then ``{"role":
    "tool", "content", "tool_call_id"}`` with the content Pipecat gives it: the
    result as JSON, ``"COMPLETED"`` for a call with no result, ``"CANCELLED"``
    for one cancelled by the user speaking (stored as :data:`CANCELLED`).
    """
    messages: list[dict[str, Any]] = []
    for turn in sorted(turns, key=lambda t: t.turn_index):
        if turn.speaker not in (USER, ASSISTANT):
            continue
        calls = turn.tool_calls or () if turn.speaker == ASSISTANT else ()
        for number, call in enumerate(calls):
            call_id = f"{_CALL_ID_PREFIX}{turn.turn_index}_{number}"
            arguments = json.dumps(call.get("arguments") or {}, ensure_ascii=False)
            messages.append({"role": ASSISTANT, "tool_calls": [
                {"id": call_id, "function": {"name": str(call.get("name", "")), "arguments": arguments},
                 "type": "function"},
            ]})
            messages.append({"role": "tool", "content": _tool_content(call.get("result")), "tool_call_id": call_id})
        if turn.text:
            messages.append({"role": turn.speaker, "content": turn.text})
    return messages


def _tool_content(result: Any) -> str:
    """The content of the tool message Pipecat writes for a call's stored result."""
    if result == CANCELLED:
        return "CANCELLED"
    return json.dumps(result, ensure_ascii=False) if result else "COMPLETED"


def _text_content(content: Any) -> str:
    """The text of an LLM message's ``content``: a string as it is, the text parts of a
    list of parts (OpenAI's format) joined with spaces, anything else as empty."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


# -- what the callbacks put on the queue (in Pipecat's order) ------------------
@dataclass(frozen=True, slots=True)
class _UserStarted:
    pass


@dataclass(frozen=True, slots=True)
class _UserText:
    part: TextPartForConcatenation
    final: bool  # a TranscriptionFrame (a final segment), else an interim one
    delta: bool = False  # an interim that adds to the previous interim (OpenAI Realtime)


@dataclass(frozen=True, slots=True)
class _RealtimeResponseStarted:
    pass


@dataclass(frozen=True, slots=True)
class _UserTurnAdded:
    content: str


@dataclass(frozen=True, slots=True)
class _UserMessageAppended:
    content: str
    kind: TurnKind


@dataclass(frozen=True, slots=True)
class _ToolCallStarted:
    call_id: str
    name: str
    arguments: Any
    cancellable: bool  # cancel_on_interruption: Pipecat records a FunctionCallCancelFrame only then


@dataclass(frozen=True, slots=True)
class _ToolCallEnded:
    call_id: str
    result: Any
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class _AssistantText:
    part: TextPartForConcatenation


@dataclass(frozen=True, slots=True)
class _AssistantTurnStopped:
    content: str
    interrupted: bool


@dataclass(frozen=True, slots=True)
class _Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class _Cancelled:
    pass


@dataclass(frozen=True, slots=True)
class _Finished:
    reason: str


_Item = (
    _UserStarted | _UserText | _RealtimeResponseStarted | _UserTurnAdded | _UserMessageAppended | _ToolCallStarted
    | _ToolCallEnded | _AssistantText | _AssistantTurnStopped | _Usage | _Cancelled | _Finished
)


class TurnlogObserver(BaseObserver):
    """Records one Pipecat pipeline's conversation as one turnlog session.

    Create it with :meth:`open` (resumes the session if turnlog has it, else
    starts it), build the LLM context from :attr:`messages`, then
    :meth:`attach` it to the worker and the aggregator pair before the worker
    runs. The module docstring says what is recorded from which frame or event.

    ``end_on``: the frame types whose ``on_pipeline_finished`` ends the
    session (see :data:`END_REASONS`). The pipeline runner's SIGINT/SIGTERM
    handler cancels the pipeline, so with the default a signalled process
    also ends its session; pass ``end_on=(EndFrame,)`` to keep a cancelled
    session resumable (a client that reconnects to another process).

    The recorder calls are made by one :class:`~turnlog.adapters._core.OrderedWriter`:
    a call that fails with a :class:`~turnlog.producers.RecorderError` (a text
    over the size limit, a full spool) is logged and kept in :attr:`errors`, and
    the writer goes on with the next event; so does it after any other error
    (logged with its type and place, counted in :attr:`failures`).

    Raises:
        ValueError: ``end_on`` names a frame type outside :data:`END_REASONS`.
    """

    def __init__(
        self,
        session: RecordedSession,
        *,
        resumed: bool = False,
        end_on: Sequence[type[Frame]] = (EndFrame, CancelFrame),
        **kwargs: Any,
    ) -> None:
        super().__init__(**{"observe_every_push": False, **kwargs})
        for frame_type in end_on:
            if frame_type not in END_REASONS:
                raise ValueError(f"end_on takes frame types out of {sorted(t.__name__ for t in END_REASONS)}, got"
                                 f" {frame_type!r}")
        self.session = session
        #: True if :meth:`open` resumed a session turnlog already had.
        self.resumed = resumed
        self._end_on = tuple(end_on)
        self._user_aggregator: object | None = None
        self._assistant_aggregator: object | None = None
        self._worker: object | None = None
        self._conversation_id: str | None = None  # Pipecat's, once known (see _trace_ids)
        self._writer: OrderedWriter[_Item] = OrderedWriter(
            session.session_id, self._write, name="turnlog-pipecat-writer"
        )
        # The observer callbacks' state (only Pipecat's observer task touches it).
        self._user_muted = False
        self._realtime = False
        self._typed_frames: set[int] = set()  # ids of the LLMMessagesAppendFrames an RTVIProcessor pushed
        # The writer's state (only the writer task touches it).
        self._next_index = session.next_turn_index
        self._user_turn: int | None = None
        self._user_finals: list[TextPartForConcatenation] = []
        self._user_interim: TextPartForConcatenation | None = None
        self._user_started = False
        self._assistant_turn: int | None = None
        self._assistant_parts: list[TextPartForConcatenation] = []
        self._cancelled = False
        self._usage = PendingUsage()
        # The tool calls of one LLM response: an assistant turn (``_calls_turn``) until each ended.
        self._calls_turn: int | None = None
        self._calls = PendingToolCalls()
        self._running: dict[str, bool] = {}  # call id -> cancellable, while Pipecat runs it

    @classmethod
    async def open(
        cls,
        recorder: SessionRecorder,
        session_id: str,
        *,
        fleet: str,
        agent_id: str,
        metadata: Mapping[str, Any] | None = None,
        resume: bool = True,
        resume_timeout: float | None = None,
        end_on: Sequence[type[Frame]] = (EndFrame, CancelFrame),
    ) -> TurnlogObserver:
        """Resume ``fleet``'s session ``session_id`` if turnlog has it (``resume=True``), else start
        it; either way it is keyed ``"<fleet>:<session_id>"`` (``observer.session.session_id``).

        A resume first waits at turnlog's resume barrier (up to
        ``resume_timeout`` seconds; default ``settings.resume_timeout_seconds``),
        so a new session costs one such check. ``agent_id`` and
        ``metadata`` are used only when the session is started.

        Raises:
            SessionClosedError: the session has ended already (it cannot be resumed).
            ResumeBarrierTimeout: the pipeline did not catch up in time (retry later).
            InvalidTurnError, SpoolError: as :meth:`SessionRecorder.start_session`.
        """
        opened = await open_or_resume(recorder, session_id, fleet=fleet, agent_id=agent_id, metadata=metadata,
                                      resume=resume, resume_timeout=resume_timeout)
        return cls(opened.recorded, resumed=opened.resumed, end_on=end_on)

    # -- what the user reads -----------------------------------------------------
    @property
    def errors(self) -> list[RecorderError]:
        """The recorder errors the writer logged and went past (newest last)."""
        return self._writer.errors

    @property
    def failures(self) -> int:
        """Events not recorded: recorder errors and errors of this adapter."""
        return self._writer.failures

    @property
    def turns(self) -> tuple[StoredTurn, ...]:
        """The turns turnlog held when the session was resumed (empty for a new session)."""
        return self.session.turns

    @property
    def messages(self) -> list[dict[str, Any]]:
        """:attr:`turns` as LLM context messages (see :func:`history_messages`)."""
        return history_messages(self.session.turns)

    def attach(self, worker: Any, aggregators: Any) -> None:
        """Observe ``worker`` (a ``PipelineWorker``) and the aggregator pair before it runs.

        ``aggregators``: an ``LLMContextAggregatorPair``, or a ``(user,
        assistant)`` pair of its aggregators. Adds this observer to the
        worker, and handlers for the user aggregator's
        ``on_user_turn_message_added``, the assistant aggregator's
        ``on_assistant_turn_stopped`` and the worker's ``on_pipeline_finished``.
        Do not also pass this observer in the worker's ``observers``.
        """
        user, assistant = aggregators
        self._user_aggregator, self._assistant_aggregator = user, assistant
        self._worker = worker
        user.add_event_handler("on_user_turn_message_added", self._on_user_turn_message_added)
        assistant.add_event_handler("on_assistant_turn_stopped", self._on_assistant_turn_stopped)
        worker.add_event_handler("on_pipeline_finished", self._on_pipeline_finished)
        worker.add_observer(self)

    async def drained(self) -> None:
        """Wait until the writer has made the recorder calls for everything queued so far
        (frames Pipecat still holds in its observer queue are not counted)."""
        await self._writer.drained()

    async def wait_closed(self, timeout: float | None = None) -> None:
        """Wait until the writer has recorded everything up to the session's end (it may be
        awaited before the pipeline produced anything).

        Raises:
            TimeoutError: not ended within ``timeout`` seconds (None: no limit).
        """
        if not await self._writer.wait_closed(timeout):
            raise TimeoutError(f"session {self.session.session_id}: not ended within {timeout} s")

    # -- Pipecat's callbacks: each only queues, in Pipecat's order ---------------
    async def on_process_frame(self, data: FrameProcessed) -> None:
        """Queue the frames the aggregators start processing (see the module docstring)."""
        frame = data.frame
        if isinstance(frame, LLMServiceMetadataFrame) and data.processor in (
            self._user_aggregator, self._assistant_aggregator
        ):
            # What switches Pipecat's aggregators to realtime mode (LLMUserAggregator._handle_service_metadata).
            self._realtime = self._realtime or bool(frame.is_realtime_service)
        if data.processor is self._user_aggregator:
            if self._user_muted and isinstance(frame, _MUTED_FRAMES):
                return  # dropped by the aggregator's mute filter: Pipecat never heard it
            if isinstance(frame, UserStartedSpeakingFrame):
                self._put(_UserStarted())
            elif isinstance(frame, LLMMessagesAppendFrame):
                # Written to the context as they are (LLMUserAggregator._handle_llm_messages_append),
                # with no on_user_turn_message_added: RTVI's send-text, or the application's own.
                kind = TurnKind.TYPED if frame.id in self._typed_frames else TurnKind.INJECTED
                self._typed_frames.discard(frame.id)
                for message in frame.messages:
                    if isinstance(message, Mapping) and message.get("role") == USER:
                        self._put(_UserMessageAppended(_text_content(message.get("content")), kind))
            elif isinstance(frame, (TranscriptionFrame, InterimTranscriptionFrame)) and frame.text.strip():
                final = isinstance(frame, TranscriptionFrame)
                delta = not final and isinstance(frame.result, _DELTA_EVENTS)
                spaces = frame.includes_inter_frame_spaces or delta  # a delta carries its own spaces
                part = TextPartForConcatenation(frame.text, includes_inter_part_spaces=spaces)
                self._put(_UserText(part, final=final, delta=delta))
        elif data.processor is self._assistant_aggregator:
            if isinstance(frame, LLMFullResponseStartFrame) and self._realtime:
                self._put(_RealtimeResponseStarted())
            if isinstance(frame, (LLMTextFrame, TTSTextFrame)):
                if frame.append_to_context and frame.text:
                    text = frame.raw_text if isinstance(frame, AggregatedTextFrame) and frame.raw_text else frame.text
                    spaces = frame.includes_inter_frame_spaces
                    self._put(_AssistantText(TextPartForConcatenation(text, includes_inter_part_spaces=spaces)))
            elif isinstance(frame, MetricsFrame):
                for metric in frame.data:
                    if isinstance(metric, LLMUsageMetricsData):
                        self._put(_Usage(input_tokens(metric.value), metric.value.completion_tokens or 0))
            elif isinstance(frame, FunctionCallInProgressFrame):
                self._put(_ToolCallStarted(frame.tool_call_id, frame.function_name, frame.arguments,
                                           bool(frame.cancel_on_interruption)))
            elif isinstance(frame, FunctionCallResultFrame):
                properties = frame.properties
                if properties is None or getattr(properties, "is_final", True):  # not an async call's update
                    self._put(_ToolCallEnded(frame.tool_call_id, frame.result))
            elif isinstance(frame, FunctionCallCancelFrame):
                self._put(_ToolCallEnded(frame.tool_call_id, None, cancelled=True))
            elif isinstance(frame, CancelFrame):
                self._put(_Cancelled())

    async def on_push_frame(self, data: FramePushed) -> None:
        """Follow what the user aggregator broadcasts: its mute state, and the user's turns it starts.

        ``LLMUserAggregator._maybe_mute_frame`` drops a frame if the user was
        muted before it, then lets the mute strategies decide the state for the
        next one, broadcasting :class:`UserMuteStartedFrame` or
        :class:`UserMuteStoppedFrame`. Pipecat tells its observers about those
        pushes after the frame that caused them, in one queue, so the state
        read in :meth:`on_process_frame` is the state the aggregator filtered
        that frame with.

        A :class:`UserStartedSpeakingFrame` the aggregator pushes downstream is
        a user turn it started itself (its turn start strategies, on its VAD or
        on a service's ``ProposedUserStartedSpeakingFrame``, as OpenAI Realtime
        sends from Pipecat 1.8): recorded as the one it processes would be.
        """
        if isinstance(data.frame, LLMMessagesAppendFrame) and isinstance(data.source, RTVIProcessor):
            self._typed_frames.add(data.frame.id)  # a client's send-text (RTVIProcessor._handle_send_text)
        if data.source is self._user_aggregator:
            if isinstance(data.frame, UserMuteStartedFrame):
                self._user_muted = True
            elif isinstance(data.frame, UserMuteStoppedFrame):
                self._user_muted = False
            elif isinstance(data.frame, UserStartedSpeakingFrame) and data.direction == FrameDirection.DOWNSTREAM:
                self._put(_UserStarted())

    async def _on_user_turn_message_added(self, aggregator: Any, message: Any) -> None:
        self._put(_UserTurnAdded(message.content))

    async def _on_assistant_turn_stopped(self, aggregator: Any, message: Any) -> None:
        self._put(_AssistantTurnStopped(message.content or "", bool(message.interrupted)))

    async def _on_pipeline_finished(self, worker: Any, frame: Frame) -> None:
        for frame_type in self._end_on:
            if isinstance(frame, frame_type):
                self._put(_Finished(END_REASONS[frame_type]))
                return

    async def cleanup(self) -> None:
        """At the worker's teardown: wait until the writer has recorded what is queued
        (and, if the pipeline's end ended the session, the end itself)."""
        await super().cleanup()
        if self._writer.stopping:
            await self._writer.wait_closed()
        else:
            await self._writer.drained()

    # -- the writer ------------------------------------------------------------
    def _put(self, item: _Item) -> None:
        self._writer.put(item, last=isinstance(item, _Finished))

    def _trace_ids(self) -> dict[str, str] | None:
        """Pipecat's conversation id as a turn span's attributes (None while unknown). Kept once
        read: Pipecat forgets an id it made up when the conversation's tracing ends, and the
        last turns may be written after that."""
        if self._conversation_id is None and self._worker is not None:
            self._conversation_id = conversation_id(self._worker)
        return framework_ids({CONVERSATION_ID_ATTRIBUTE: self._conversation_id},
                             beside=self.session.trace_attributes) or None

    def _fresh_index(self) -> int:
        index = max(self._next_index, self.session.next_turn_index)
        self._next_index = index + 1
        return index

    async def _write(self, item: _Item) -> None:
        session = self.session
        if isinstance(item, _UserStarted):
            self._user_started = True
        elif isinstance(item, _RealtimeResponseStarted):
            # In realtime mode Pipecat writes the user's message to the context when the
            # response starts, and its transcript may come later
            # (LLMAssistantAggregator._realtime_handle_llm_start): the user turn takes its
            # index before the response's.
            if self._user_turn is None and (self._user_started or self._user_finals):
                self._user_turn = self._fresh_index()
        elif isinstance(item, _UserText):
            if item.final:
                self._user_finals.append(item.part)
                self._user_interim = None
            elif item.delta and self._user_interim is not None:
                self._user_interim = TextPartForConcatenation(
                    self._user_interim.text + item.part.text, includes_inter_part_spaces=True
                )
            else:
                self._user_interim = item.part
            parts = self._user_finals + ([self._user_interim] if self._user_interim else [])
            if self._user_turn is None:
                self._user_turn = self._fresh_index()
            session.update_partial(self._user_turn, USER, concatenate_aggregated_text(parts))
        elif isinstance(item, _UserTurnAdded):
            index, self._user_turn = self._user_turn, None
            self._user_finals, self._user_interim, self._user_started = [], None, False
            if index is None and not item.content:
                return
            await session.complete_turn(index if index is not None else self._fresh_index(), USER, item.content,
                                        trace_attributes=self._trace_ids())
        elif isinstance(item, _AssistantText):
            self._assistant_parts.append(item.part)
            if self._assistant_turn is None:
                self._assistant_turn = self._fresh_index()
            session.update_partial(self._assistant_turn, ASSISTANT, concatenate_aggregated_text(self._assistant_parts))
        elif isinstance(item, _UserMessageAppended):
            # Its own turn, beside a spoken one the user may have open.
            if item.content:
                await session.complete_turn(self._fresh_index(), USER, item.content, kind=item.kind,
                                            trace_attributes=self._trace_ids())
        elif isinstance(item, _ToolCallStarted):
            # Pipecat writes the call to its context now (an assistant message with the call,
            # then the tool message): the calls of one LLM response are an assistant turn of
            # their own, with no text, at this place. The response's text is written when its
            # turn stops, which (with a TTS, from Pipecat 1.14) may be after the results and
            # after the user's next message: it stays a turn of its own.
            if self._calls_turn is None:
                self._calls_turn = self._fresh_index()
            self._calls.call(item.call_id, item.name, item.arguments)
            self._running[item.call_id] = item.cancellable
        elif isinstance(item, _ToolCallEnded):
            cancellable = self._running.get(item.call_id)
            if cancellable is None or (item.cancelled and not cancellable):
                return  # not running, or an async call, which Pipecat does not cancel
            del self._running[item.call_id]
            self._calls.result(item.call_id, dict(CANCELLED) if item.cancelled else item.result)
            await self._complete_calls_turn()
        elif isinstance(item, _AssistantTurnStopped):
            index, self._assistant_turn = self._assistant_turn, None
            self._assistant_parts = []
            if index is None and not item.content:
                return
            if index is None:
                index = self._fresh_index()
            if item.interrupted and self._cancelled:
                # Cut off by the pipeline's cancellation (a hang-up), not by the user:
                # left open with the words spoken, so the session's end keeps it interrupted.
                if item.content:
                    session.update_partial(index, ASSISTANT, item.content)
                return
            tokens_in, tokens_out = self._usage.take()
            await session.complete_turn(
                index, ASSISTANT, item.content, barged_in=item.interrupted,
                input_tokens=tokens_in, output_tokens=tokens_out, trace_attributes=self._trace_ids(),
            )
        elif isinstance(item, _Usage):
            self._usage.add(item.prompt_tokens, item.completion_tokens)
        elif isinstance(item, _Cancelled):
            self._cancelled = True
        elif isinstance(item, _Finished):
            # Calls still running at the end are recorded without a result.
            self._running.clear()
            await self._complete_calls_turn()
            await session.end(item.reason)

    async def _complete_calls_turn(self) -> None:
        """Complete the assistant turn of tool calls once every call of it has ended (a result,
        or cancelled). It carries the tokens of the LLM calls so far (the response that asked
        for the calls)."""
        index = self._calls_turn
        if index is None or self._running:
            return
        self._calls_turn = None
        tokens_in, tokens_out = self._usage.take()
        await self.session.complete_turn(
            index, ASSISTANT, "", input_tokens=tokens_in, output_tokens=tokens_out, tool_calls=self._calls.take(),
            trace_attributes=self._trace_ids(),
        )
