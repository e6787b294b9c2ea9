"""OpenAI Agents SDK adapter: a write-through ``Session`` that records the conversation in turnlog.

Usage (``pip install 'turnlog[openai-agents]'``)::

    async with SessionRecorder(TurnlogSettings()) as recorder:
        session = await TurnlogSession.open(
            recorder, SQLiteSession("call-42", "chats.db"), fleet="support", agent_id="bot-7"
        )
        result = await Runner.run(agent, "Where is my order?", session=session, hooks=session.hooks)
        streamed = Runner.run_streamed(agent, "And the invoice?", session=session, hooks=session.hooks)
        async for event in session.stream(streamed):     # the agent's partial text, as it streams
            ...
        await session.end("completed")

What it records, and from where:

- ``add_items`` (the Runner saves the user's input before the model call and
  the generated items after it): each user message (``role == "user"``) is a
  completed ``user`` turn and each assistant output message (``type ==
  "message"``, ``role == "assistant"``) a completed ``assistant`` turn; the
  text is the concatenation of the message's text parts (``input_text``,
  ``output_text``, ``refusal``). Function calls (``function_call`` with its
  ``function_call_output``) become the ``tool_calls`` of the next assistant
  turn (name, arguments as a JSON object, the output as the result). Other
  items (reasoning, system messages, hosted tool calls) go to the inner
  session only.
- Tokens: :attr:`TurnlogSession.hooks` is a ``RunHooks`` whose ``on_llm_end``
  adds each model response's ``usage`` (input and output tokens) to the next
  assistant turn recorded; pass it as ``Runner.run(..., hooks=session.hooks)``
  (a run with other hooks subclasses :class:`TurnlogRunHooks` and calls
  ``super()``). Without it the turns carry no tokens. A response that only
  calls tools adds its tokens to the assistant turn that follows.
- Partial text: :meth:`TurnlogSession.stream` wraps
  ``Runner.run_streamed(...).stream_events()``: each ``response.output_text.delta``
  updates the open assistant turn's whole text so far (the recorder's timer
  flushes it). The saved message completes that turn at the same index. A
  turn is one message of one model response (deltas of one ``item_id`` until
  the response's ``response.completed``): item ids are not unique, since Chat
  Completions, LiteLLM and any-llm models give every item the SDK's
  ``FAKE_RESPONSES_ID`` (``agents/models/fake_id.py``); a saved message
  completes the oldest open turn with its id, else the oldest open turn.
  A streamed message that the run never saved (``result.cancel()`` mid-answer)
  is completed ``barged_in=True`` with the text streamed so far: the words
  the user saw. A caller that stops iterating early closes the generator
  (``async with contextlib.aclosing(session.stream(result))``), so this
  happens at once rather than when it is garbage-collected. If the run saves
  that message after all, it is not recorded again (until the next user
  message, which starts a new run).
- Guardrails: while a guardrail may still block the streamed answer (input
  guardrails running in parallel with the model, or an output guardrail of
  the current agent or of the ``RunConfig`` given as ``stream(result,
  run_config=...)``), its text is held and no partial is recorded: a partial
  reaches the spool, the broker and the store's event log, where a block
  could not take it back. An answer a guardrail blocks
  (``InputGuardrailTripwireTriggered`` / ``OutputGuardrailTripwireTriggered``)
  is not in the SDK's session; it is completed as a turn of kind ``blocked``
  with no text (its tokens kept), and never given back on resume.
- Tool approvals: a ``needs_approval`` call is saved before the approval;
  when a new process runs the approved (or rejected) ``RunState``,
  :meth:`TurnlogSession.open` has taken up the calls the inner session holds
  after its last assistant message, so the answer's turn carries each call and
  its output (the tool's result, or the SDK's rejection message).

Traces: each turn's span carries the SDK's ids of the run that saved it (the
SDK's trace has no OpenTelemetry keys of its own; these are the keys
OpenTelemetry bridges of its traces use): ``openai.agents.trace_id`` (the run's
trace, ``trace_<32 hex>`` as in OpenAI's Traces dashboard),
``openai.agents.group_id`` (``RunConfig.group_id``, the conversation the SDK
groups traces by) when set, and on an assistant turn ``gen_ai.response.id``
(the model response that produced it: a streamed one's ``response.completed``
id, else the ``ModelResponse.response_id`` :attr:`TurnlogSession.hooks` saw
last; none for an answer cut before its response completed). No trace ids
when the SDK's tracing is disabled (its no-op trace); a no-op when turnlog's
tracing is off.

``get_items``, ``pop_item`` and ``clear_session`` go to the inner session
(any ``Session`` of the SDK: SQLite, SQLAlchemy, Redis...). turnlog is
append-only: a popped or cleared item stays recorded, and an item the Runner
pops and adds back (its rewind on a conversation retry) is not recorded twice.
Whatever else the SDK looks up on a session is the inner session's (a
compaction session's ``run_compaction`` and generation hooks; a Conversations
session passes ``isinstance``): see :class:`TurnlogSession`.

Latency: the Runner saves the run's input before the model call; a batch of
user messages only is written in the background (in order, ahead of every
later call), so the model call does not wait for turnlog's spool and broker
acknowledgement (up to ``ack_wait_seconds``). The save of the answer waits
for it, so when ``Runner.run`` returns both are recorded; a SIGKILL in the
first milliseconds of the model call can lose the question from turnlog and
the inner session both, never from turnlog alone. An inner session with the
SDK's compaction generation hooks gets every save awaited (see
:meth:`TurnlogSession.add_items`).

Cancellation (openai/openai-agents-python#1658): ``add_items`` runs its write
in a task of its own and awaits it through ``asyncio.shield``. A caller
cancelled mid-save gets its ``CancelledError`` at once, while the write goes
on: the turns are recorded in turnlog first (each spooled and fsynced, then
acknowledged by the broker, as ``complete_turn`` does), then the items are
saved in the inner session. Every later call (``get_items``, ``add_items``,
``pop_item``, ``clear_session``, :meth:`TurnlogSession.end`) waits for the
writes still running, so the framework reads its own writes in order.
turnlog comes first because it is the log that survives the process: a
SIGKILL between the two leaves turnlog one write ahead of the inner session,
and the next :meth:`TurnlogSession.open` appends what the inner session lacks.
The opposite order would leave a turn the framework has but the log lost.

Resume: :meth:`TurnlogSession.open` resumes the session if turnlog has it
(``SessionRecorder.resume``: the resume barrier, a new epoch) and starts it
otherwise. With ``rebuild=True`` (the default) it then compares the inner
session's user and assistant messages with turnlog's complete turns: if the
inner session holds none of them (it lost its items: an in-memory or a new
SQLite file) or holds a run of them that stops short of the last, the
missing turns are added to the inner session as ``{"role", "content"}``
messages, not recorded again, each assistant turn after its tool calls as a
``function_call`` and ``function_call_output`` pair (turnlog keeps no call
ids: each pair gets ``turnlog_<turn index>_<n>``). Barged-in and blocked turns
are not rebuilt (answers cut short or blocked, which the SDK never saved: they
are neither expected in the inner session nor added to it). A
compacted inner session (its items replaced by a summary) differs from
turnlog and is left as it is. An inner session whose messages are not such a run (edited) is
left as it is, with a warning. turnlog cannot tell a tail lost in a kill
from one removed on purpose: an inner session whose last items were popped,
or that was cleared, gets them back when a new process opens it; open it
with ``rebuild=False`` to keep it as it is.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents import RunHooks
from agents.exceptions import InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered
from agents.items import ModelResponse, TResponseInputItem
from agents.memory import OpenAIConversationsSession
from agents.result import RunResultStreaming
from agents.stream_events import RawResponsesStreamEvent, StreamEvent
from agents.tracing import get_current_trace
from openai.types.responses import ResponseCompletedEvent, ResponseTextDeltaEvent

from turnlog.adapters._core import (
    ASSISTANT,
    USER,
    PendingToolCalls,
    PendingUsage,
    after_latest_match,
    arguments_object,
    conversation,
    framework_ids,
    open_or_resume,
)
from turnlog.producers import RecordedSession, SessionRecorder
from turnlog.schemas import ToolCall, TurnKind

__all__ = [
    "ASSISTANT",
    "GROUP_ID_ATTRIBUTE",
    "RESPONSE_ID_ATTRIBUTE",
    "TRACE_ID_ATTRIBUTE",
    "USER",
    "TurnlogRunHooks",
    "TurnlogSession",
]

logger = logging.getLogger(__name__)

_GENERATION_HOOKS = ("_get_items_with_generation", "_add_items_with_generation")
#: The trace attributes of a turn's span: the SDK's trace id and group id of the run that saved
#: it (the keys OpenTelemetry bridges of the SDK's traces use), and the model response's id
#: (OpenTelemetry's GenAI key, as those bridges put it on a response's span).
TRACE_ID_ATTRIBUTE = "openai.agents.trace_id"
GROUP_ID_ATTRIBUTE = "openai.agents.group_id"
RESPONSE_ID_ATTRIBUTE = "gen_ai.response.id"
_NO_OP_TRACE_ID = "no-op"  # the SDK's NoOpTrace.trace_id: tracing disabled
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}


@dataclass(slots=True)
class _Streamed:
    """An assistant message streamed by one model response: its item id (not unique:
    Chat Completions, LiteLLM and any-llm models give every item the SDK's
    ``FAKE_RESPONSES_ID``, ``agents/models/fake_id.py``), its turn index, the text
    so far, and whether its response completed (a later delta is a new message), with
    that response's id."""

    item_id: str
    turn_index: int
    text: str = ""
    done: bool = False
    response_id: str | None = None
    started_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    partial: bool = False  # its text so far was given to the recorder as the turn's partial


@dataclass(frozen=True, slots=True)
class _Message:
    """A user or assistant message of the conversation, parsed from an item."""

    speaker: str
    text: str
    item_id: str | None = None
    tool_calls: tuple[ToolCall, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class _Turn:
    """A turn to record: decided when ``add_items`` is called, recorded by its write."""

    index: int
    speaker: str
    text: str
    tool_calls: tuple[ToolCall, ...]
    input_tokens: int
    output_tokens: int
    trace_attributes: dict[str, str] | None = None
    started_at: dt.datetime | None = None  # a streamed message's first delta, when no partial was recorded


class TurnlogRunHooks(RunHooks[Any]):
    """``RunHooks`` giving each model response's token usage to ``session``
    (``on_llm_end``: ``response.usage.input_tokens`` and ``output_tokens``, whole tokens),
    and its ``response_id`` for the span of the assistant turn it produced."""

    def __init__(self, session: TurnlogSession) -> None:
        self._session = session

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        self._session._usage.add(response.usage.input_tokens, response.usage.output_tokens)
        self._session._response_id = getattr(response, "response_id", None)


class TurnlogSession:
    """A ``Session`` of the OpenAI Agents SDK that records the conversation in
    turnlog and keeps the items in ``inner``. Make it with :meth:`open`.

    ``session_id`` is the inner session's; ``recorded`` is the turnlog session
    (:class:`turnlog.producers.RecordedSession`). ``history`` holds the turns
    turnlog had when it was opened (empty for a new session).

    Whatever else the SDK looks up on a session is the inner session's: any
    attribute this class does not define is read from ``inner`` (the SDK finds
    ``run_compaction`` by ``getattr``, ``agents/memory/session.py``
    ``is_openai_responses_compaction_aware_session``, and the compaction
    generation hooks ``_get_items_with_generation`` / ``_add_items_with_generation``
    the same way, ``agents/run_internal/session_persistence.py``; those hooks
    call back into this session's ``get_items`` and ``add_items``, so the items
    are still recorded). ``isinstance(session, OpenAIConversationsSession)``
    (how the SDK strips item ids for the Conversations API) is true when
    ``inner`` is one. A ``wrapper`` keyword the SDK passes to a session's
    methods is passed on to the inner session's methods that take it.
    """

    def __init__(self, inner: Any, recorded: RecordedSession) -> None:
        self.inner = inner
        self.recorded = recorded
        self.session_id: str = inner.session_id
        self.hooks = TurnlogRunHooks(self)
        self._usage = PendingUsage()
        self._response_id: str | None = None  # the latest model response's, for the next assistant turn
        self._lock = asyncio.Lock()  # FIFO: writes reach turnlog and the inner session in call order
        self._writes: set[asyncio.Task[None]] = set()
        self._tool_calls = PendingToolCalls()
        self._streamed: list[_Streamed] = []  # open streamed assistant turns, oldest first
        self._cut: list[_Streamed] = []  # streamed messages completed as cut short, until the next user message
        self._popped: list[str] = []  # canonical JSON of recorded items popped from the inner session
        # An inner session that counts its own mutations (the compaction session's generation
        # hooks) needs its items saved when add_items returns: its input writes are awaited too.
        self._queue_input = not any(callable(getattr(inner, name, None)) for name in _GENERATION_HOOKS)
        self._next_index = 0  # the turn index after the last one given out (see _fresh_index)
        self._failure: BaseException | None = None  # a queued input write's, for the next caller

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class does not define: the inner session's features.
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # isinstance() falls back on __class__: the SDK's Conversations checks see the inner session.
        inner = self.__dict__.get("inner")
        return type(inner) if isinstance(inner, OpenAIConversationsSession) else type(self)

    @property
    def session_settings(self) -> Any:
        """The inner session's ``SessionSettings`` (its default ``get_items`` limit)."""
        return getattr(self.inner, "session_settings", None)

    @property
    def history(self) -> tuple[Any, ...]:
        """The turns turnlog held when this session was resumed (``StoredTurn``, turn order)."""
        return self.recorded.turns

    @classmethod
    async def open(
        cls,
        recorder: SessionRecorder,
        inner: Any,
        *,
        fleet: str,
        agent_id: str,
        metadata: Mapping[str, Any] | None = None,
        rebuild: bool = True,
    ) -> TurnlogSession:
        """Resume ``inner.session_id`` in turnlog if turnlog has it, else start it (the turnlog session
        is ``fleet``'s session of that id, keyed ``"<fleet>:<inner.session_id>"``);
        with ``rebuild``, add to ``inner`` the recorded turns it lacks (see the module docstring).

        Raises:
            SessionClosedError: turnlog has the session and it has ended.
            ResumeBarrierTimeout, SpoolError, InvalidTurnError: as
                ``SessionRecorder.resume`` and ``start_session``.
        """
        opened = await open_or_resume(recorder, inner.session_id, fleet=fleet, agent_id=agent_id, metadata=metadata)
        session = cls(inner, opened.recorded)
        if rebuild and opened.recorded.turns:
            await session._rebuild()
        if opened.resumed:
            session._adopt_pending_calls(await inner.get_items())
        return session

    # -- the Session protocol ------------------------------------------------
    async def get_items(self, limit: int | None = None, *, wrapper: Any = None) -> list[TResponseInputItem]:
        """The inner session's items (after the writes still running)."""
        await self._settle_writes()
        async with self._lock:
            return await _call(self.inner.get_items, limit, wrapper=wrapper)

    async def add_items(self, items: list[TResponseInputItem], *, wrapper: Any = None) -> None:
        """Record the user and assistant messages of ``items`` in turnlog, then save
        ``items`` in the inner session, in a task a cancellation does not stop.

        A batch of user messages only (the run's input, which the Runner saves
        before the model call) returns once its write is queued: the model call
        does not wait for turnlog's spool and broker acknowledgement (up to
        ``ack_wait_seconds``). Every later call waits for that write first,
        so the Runner's save of the answer returns only once the question is
        recorded too. Any other batch returns once it is written, and so does
        every batch when the inner session has the SDK's compaction generation
        hooks (``_add_items_with_generation``: it must count the save when
        ``add_items`` returns).

        Raises:
            RecorderError: turnlog refused a turn (``InvalidTurnError``, ``SpoolFullError``...);
                the items are saved in the inner session all the same. A queued
                input write's failure is raised by the next ``add_items`` or :meth:`end`.
            Whatever the inner session's ``add_items`` raises (likewise, for a queued write).
        """
        items = list(items)
        turns = self._plan(items)
        write = asyncio.ensure_future(self._write(turns, items, wrapper))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)
        if self._queue_input and items and all(_is_user_message(item) for item in items):
            write.add_done_callback(self._keep_failure)
            return
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            write.add_done_callback(_log_failure)  # nobody awaits it now: a failure is logged
            raise
        self._raise_kept_failure()

    async def pop_item(self, *, wrapper: Any = None) -> TResponseInputItem | None:
        """Pop the inner session's newest item; turnlog keeps what it recorded."""
        await self._settle_writes()
        async with self._lock:
            item = await _call(self.inner.pop_item, wrapper=wrapper)
            if item is not None:
                self._popped.append(_canonical(item))
            return item

    async def clear_session(self, *, wrapper: Any = None) -> None:
        """Clear the inner session; turnlog keeps what it recorded."""
        await self._settle_writes()
        async with self._lock:
            self._popped.clear()
            await _call(self.inner.clear_session, wrapper=wrapper)

    # -- streaming -----------------------------------------------------------
    async def stream(self, result: RunResultStreaming, *, run_config: Any = None) -> AsyncIterator[StreamEvent]:
        """Yield ``result.stream_events()`` unchanged, recording the assistant's
        text deltas as the partial text of its open turn (one turn per output
        message item of a model response: ``response.output_text.delta`` events
        of one ``item_id`` until that response's ``response.completed``).

        While a guardrail may still block the answer (input guardrails running in
        parallel with the model, or output guardrails of the current agent or of
        ``run_config``, the ``RunConfig`` the run was given), its text is held here
        and no partial is recorded: partial text reaches the spool, the broker and
        the store's event log, where a later block could not take it back.

        When the stream ends, a streamed message the run did not save is completed:
        if a guardrail tripped (``InputGuardrailTripwireTriggered`` /
        ``OutputGuardrailTripwireTriggered``), as a turn of kind ``blocked`` with no
        text (the SDK keeps only the user's message); otherwise ``barged_in=True``
        with the text streamed so far (``result.cancel()`` mid-answer)."""
        tripped = False
        try:
            async for event in result.stream_events():
                if isinstance(event, RawResponsesStreamEvent):
                    if isinstance(event.data, ResponseTextDeltaEvent):
                        self._on_delta(event.data.item_id, event.data.delta, _guarded(result, run_config))
                    elif isinstance(event.data, ResponseCompletedEvent):
                        response_id = getattr(event.data.response, "id", None)
                        for streamed in self._streamed:
                            if not streamed.done:
                                streamed.done, streamed.response_id = True, response_id
                yield event
        except (InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered):
            tripped = True
            raise
        finally:
            tripped = tripped or _tripped(result)
            await self._settle_writes()
            async with self._lock:
                while self._streamed:
                    streamed = self._streamed.pop(0)
                    input_tokens, output_tokens = self._usage.take()
                    self._response_id = None  # an earlier response's (tool calls): not this message's
                    trace_attributes = self._trace_ids(getattr(result, "trace", None), streamed.response_id)
                    if tripped:
                        if streamed.partial:
                            logger.warning(
                                "session %s: turn %d was blocked by a guardrail after its partial text was"
                                " recorded (a RunConfig guardrail: pass run_config to stream())",
                                self.session_id, streamed.turn_index,
                            )
                        await self.recorded.complete_turn(
                            streamed.turn_index, ASSISTANT, "", started_at=streamed.started_at, kind=TurnKind.BLOCKED,
                            input_tokens=input_tokens, output_tokens=output_tokens, trace_attributes=trace_attributes,
                        )
                        continue
                    self._cut.append(streamed)  # if the run saves it after all, it is recorded already
                    await self.recorded.complete_turn(
                        streamed.turn_index, ASSISTANT, streamed.text, barged_in=True, started_at=streamed.started_at,
                        input_tokens=input_tokens, output_tokens=output_tokens, trace_attributes=trace_attributes,
                    )

    # -- the turnlog session -------------------------------------------------
    async def end(self, reason: str = "completed") -> None:
        """Wait for the writes still running, then end the turnlog session
        (the inner session is left as it is). Raises as ``RecordedSession.end``."""
        await self._settle_writes()
        async with self._lock:
            await self.recorded.end(reason)
        self._raise_kept_failure()

    # -- internals -----------------------------------------------------------
    def _on_delta(self, item_id: str, delta: str, guarded: bool) -> None:
        """Add ``delta`` to its message's text; record the text so far as the turn's partial,
        unless a guardrail may still block it (``guarded``: the text is held until it may not)."""
        streamed = next((s for s in reversed(self._streamed) if s.item_id == item_id and not s.done), None)
        if streamed is None:
            streamed = _Streamed(item_id, self._fresh_index())
            self._streamed.append(streamed)
        streamed.text += delta
        if not guarded:
            self.recorded.update_partial(streamed.turn_index, ASSISTANT, streamed.text, started_at=streamed.started_at)
            streamed.partial = True

    async def _settle_writes(self) -> None:
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    def _fresh_index(self) -> int:
        """A turn index after every index given out, so turns planned before their write keep call order."""
        index = max(self.recorded.next_turn_index, self._next_index)
        self._next_index = index + 1
        return index

    def _keep_failure(self, write: asyncio.Task[None]) -> None:
        if not write.cancelled() and write.exception() is not None and self._failure is None:
            self._failure = write.exception()

    def _raise_kept_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    async def _write(self, turns: list[_Turn], items: list[TResponseInputItem], wrapper: Any) -> None:
        async with self._lock:
            failure: BaseException | None = None
            try:
                for turn in turns:
                    await self.recorded.complete_turn(
                        turn.index, turn.speaker, turn.text, tool_calls=turn.tool_calls or None,
                        input_tokens=turn.input_tokens, output_tokens=turn.output_tokens,
                        trace_attributes=turn.trace_attributes, started_at=turn.started_at,
                    )
            except Exception as e:  # raised below, once the inner session has the items too
                failure = e
            await _call(self.inner.add_items, items, wrapper=wrapper)
            if failure is not None:
                raise failure

    def _plan(self, items: Sequence[TResponseInputItem]) -> list[_Turn]:
        """The turns to record for ``items``, with their indexes and tokens, decided when
        ``add_items`` is called (so in call order, whenever the write runs)."""
        return [turn for turn in map(self._turn, self._messages(items)) if turn is not None]

    def _messages(self, items: Sequence[TResponseInputItem]) -> list[_Message]:
        """The messages of ``items`` to record: tool calls folded into the next
        assistant message; items popped from the inner session and added back skipped."""
        messages = []
        for item in items:
            if not isinstance(item, Mapping):
                continue
            if self._popped:
                if self._popped[-1] == _canonical(item):
                    self._popped.pop()  # the Runner restores what it popped: recorded already
                    continue
                self._popped.clear()  # a new item, not a restore
            kind = item.get("type")
            if kind == "function_call":
                self._tool_calls.call(str(item.get("call_id")), str(item.get("name")), item.get("arguments"))
                continue
            if kind == "function_call_output":
                self._tool_calls.result(str(item.get("call_id")), item.get("output"))
                continue
            message = _message(item)
            if message is None:
                continue
            if message.speaker == ASSISTANT and self._tool_calls:
                message = _Message(message.speaker, message.text, message.item_id, self._tool_calls.take())
            messages.append(message)
        return messages

    def _turn(self, message: _Message) -> _Turn | None:
        if message.speaker == USER:
            self._cut.clear()  # a new run's input: the cut runs saved what they were going to
        else:
            cut = _take_match(self._cut, message, lambda c: message.text.startswith(c.text))
            if cut is not None:
                return None  # a cut message the run saved after all: recorded as the user saw it
        streamed = _take_match(self._streamed, message, lambda s: True) if message.speaker == ASSISTANT else None
        index = streamed.turn_index if streamed is not None else self._fresh_index()
        input_tokens, output_tokens = self._usage.take() if message.speaker == ASSISTANT else (0, 0)
        response_id = None
        if message.speaker == ASSISTANT:  # the streamed response's id, else the latest one the hooks saw
            hooked, self._response_id = self._response_id, None
            response_id = streamed.response_id if streamed is not None and streamed.response_id else hooked
        return _Turn(index, message.speaker, message.text, message.tool_calls, input_tokens, output_tokens,
                     self._trace_ids(get_current_trace(), response_id),
                     streamed.started_at if streamed is not None else None)

    def _trace_ids(self, trace: Any, response_id: str | None = None) -> dict[str, str] | None:
        """A turn span's attributes: ``trace``'s id and group id (the SDK's trace of the run
        saving the turn; none for its no-op trace), and ``response_id``, the model response
        that produced an assistant turn."""
        trace_id = getattr(trace, "trace_id", None)
        ids: dict[str, object] = {RESPONSE_ID_ATTRIBUTE: response_id}
        if trace_id != _NO_OP_TRACE_ID:
            ids.update({TRACE_ID_ATTRIBUTE: trace_id, GROUP_ID_ATTRIBUTE: getattr(trace, "group_id", None)})
        return framework_ids(ids, beside=self.recorded.trace_attributes) or None

    async def _rebuild(self) -> None:
        # A barged-in turn is the words the user saw of an answer the run never saved, and a
        # blocked one an answer a guardrail kept from the SDK's session: the inner session
        # never holds them, so they are neither matched against nor added back.
        stored = [t for t in conversation(self.recorded.turns, unfinished=False)
                  if not t.barged_in and t.kind != TurnKind.BLOCKED]
        held = [(m.speaker, m.text) for m in map(_message, await self.inner.get_items()) if m is not None]
        start = _missing_from(held, [(t.speaker, t.text) for t in stored])
        if start is None:
            logger.warning(
                "session %s: the inner session's %d messages differ from turnlog's %d turns; not rebuilt",
                self.session_id, len(held), len(stored),
            )
            return
        missing = [item for turn in stored[start:] for item in _items_of(turn)]
        if missing:
            await self.inner.add_items(missing)
            logger.info("session %s: rebuilt %d items of the inner session from turnlog", self.session_id,
                        len(missing))

    def _adopt_pending_calls(self, items: Sequence[Any]) -> None:
        """Take as pending the function calls (and the outputs held of them) that ``items``, the
        inner session's, holds after its last assistant message: the calls of a run not finished
        when this session was opened (a ``RunState`` saved at a tool approval and run again in a
        new process; a process killed between a tool call and its answer). Their outputs and the
        answer then come in this process, and the answer's turn gets them, as in one process."""
        tail: list[Any] = []
        for item in items:
            message = _message(item)
            if message is not None and message.speaker == ASSISTANT:
                tail = []
            elif isinstance(item, Mapping) and item.get("type") in ("function_call", "function_call_output"):
                tail.append(item)
        for item in tail:
            if item.get("type") == "function_call":
                self._tool_calls.call(str(item.get("call_id")), str(item.get("name")), item.get("arguments"))
            else:
                self._tool_calls.result(str(item.get("call_id")), item.get("output"))


def _guarded(result: Any, run_config: Any) -> bool:
    """Whether a guardrail may still block the answer ``result`` streams now: input guardrails
    running in parallel with the model (the SDK's ``_input_guardrails_task``, set before the
    first model call; where an SDK lacks it, any input guardrail of the agent or ``run_config``),
    one that tripped already, or an output guardrail of the current agent or of ``run_config``
    (they check the final output, which no delta tells apart from an intermediate message)."""
    agent = getattr(result, "current_agent", None)
    if getattr(agent, "output_guardrails", None) or getattr(run_config, "output_guardrails", None):
        return True
    if _tripped(result):
        return True
    if not hasattr(result, "_input_guardrails_task"):
        return bool(getattr(agent, "input_guardrails", None) or getattr(run_config, "input_guardrails", None))
    task: asyncio.Task[Any] | None = result._input_guardrails_task
    return task is not None and not task.done()


def _tripped(result: Any) -> bool:
    """Whether a guardrail of the run ``result`` tripped (its input and output guardrail results)."""
    results = [*(getattr(result, "input_guardrail_results", None) or ()),
               *(getattr(result, "output_guardrail_results", None) or ())]
    return any(getattr(getattr(r, "output", None), "tripwire_triggered", False) for r in results)


def _log_failure(write: asyncio.Task[None]) -> None:
    if not write.cancelled() and write.exception() is not None:
        logger.error("a session write whose caller was cancelled failed", exc_info=write.exception())


def _missing_from(held: list[tuple[str, str]], stored: list[tuple[str, str]]) -> int | None:
    """Where the turns ``held`` lacks start in ``stored`` (``_core.after_latest_match``):
    0 if it holds none; the position after the latest run of ``stored`` that ends
    like ``held``; None if there is none."""
    return after_latest_match(held, stored)


def _take_match(open_: list[_Streamed], message: _Message, fits: Any) -> _Streamed | None:
    """Remove and return the oldest entry of ``open_`` with ``message``'s item id that
    ``fits``; else (ids the model does not set, or sets to one placeholder) the oldest
    that ``fits``."""
    for same_id in (True, False):
        for i, entry in enumerate(open_):
            if (not same_id or entry.item_id == message.item_id) and fits(entry):
                return open_.pop(i)
    return None


async def _call(method: Any, *args: Any, wrapper: Any) -> Any:
    """``method(*args)``, with ``wrapper=`` when the SDK gave one and ``method`` takes it
    (the SDK's opt-in, ``agents/memory/session.py`` ``_session_method_accepts_wrapper``)."""
    if wrapper is not None and _takes_wrapper(method):
        return await method(*args, wrapper=wrapper)
    return await method(*args)


def _takes_wrapper(method: Any) -> bool:
    try:
        parameter = inspect.signature(method).parameters.get("wrapper")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                        inspect.Parameter.KEYWORD_ONLY)


def _message(item: Any) -> _Message | None:
    """The user or assistant message ``item`` holds (None for any other item)."""
    if not isinstance(item, Mapping):
        return None
    role, kind = item.get("role"), item.get("type", "message")
    if kind != "message" or role not in (USER, ASSISTANT):
        return None
    content = item.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(
            str(part.get(_TEXT_PARTS[part["type"]]) or "")
            for part in content
            if isinstance(part, Mapping) and part.get("type") in _TEXT_PARTS
        )
    else:
        return None
    item_id = item.get("id")
    return _Message(role, text, item_id if isinstance(item_id, str) else None)


def _items_of(turn: Any) -> list[dict[str, Any]]:
    """The inner session's items for a stored turn: a ``{"role", "content"}`` message, after a
    ``function_call`` and its ``function_call_output`` for each of an assistant turn's tool calls
    (turnlog keeps no call ids: each pair gets ``turnlog_<turn index>_<n>``)."""
    items: list[dict[str, Any]] = []
    calls = (turn.tool_calls or ()) if turn.speaker == ASSISTANT else ()
    for n, call in enumerate(calls):
        call_id = f"turnlog_{turn.turn_index}_{n}"
        items.append({"type": "function_call", "call_id": call_id, "name": call.get("name"),
                      "arguments": json.dumps(call.get("arguments") or {})})
        result = call.get("result")
        items.append({"type": "function_call_output", "call_id": call_id,
                      "output": result if isinstance(result, str | list) else json.dumps(result)})
    items.append({"role": turn.speaker, "content": turn.text})
    return items


def _is_user_message(item: Any) -> bool:
    message = _message(item)
    return message is not None and message.speaker == USER


_arguments = arguments_object  # a function call's arguments as a JSON object (``_core.arguments_object``)


def _canonical(item: Any) -> str:
    return json.dumps(item, sort_keys=True, default=str)
