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
  flushes it). The saved message completes that turn at the same index.
  A streamed message that the run never saved (``result.cancel()`` mid-answer)
  is completed ``barged_in=True`` with the text streamed so far: the words
  the user saw. A caller that stops iterating early closes the generator
  (``async with contextlib.aclosing(session.stream(result))``), so this
  happens at once rather than when it is garbage-collected.

``get_items``, ``pop_item`` and ``clear_session`` go to the inner session
(any ``Session`` of the SDK: SQLite, SQLAlchemy, Redis...). turnlog is
append-only: a popped or cleared item stays recorded, and an item the Runner
pops and adds back (its rewind on a conversation retry) is not recorded twice.

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
messages, not recorded again. Tool calls are not rebuilt (turnlog keeps no
call ids). An inner session whose messages are not such a run (edited) is
left as it is, with a warning. turnlog cannot tell a tail lost in a kill
from one removed on purpose: an inner session whose last items were popped,
or that was cleared, gets them back when a new process opens it; open it
with ``rebuild=False`` to keep it as it is.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents import RunHooks
from agents.items import ModelResponse, TResponseInputItem
from agents.result import RunResultStreaming
from agents.stream_events import RawResponsesStreamEvent, StreamEvent
from openai.types.responses import ResponseTextDeltaEvent

from turnlog.producers import RecordedSession, SessionNotFoundError, SessionRecorder
from turnlog.schemas import ToolCall, TurnStatus

__all__ = ["TurnlogSession", "TurnlogRunHooks", "USER", "ASSISTANT"]

logger = logging.getLogger(__name__)

#: Speakers of the recorded turns (the SDK's message roles).
USER = "user"
ASSISTANT = "assistant"
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}


@dataclass(slots=True)
class _Usage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(slots=True)
class _Streamed:
    """An assistant message being streamed: its turn index and the text so far."""

    turn_index: int
    text: str = ""


@dataclass(frozen=True, slots=True)
class _Message:
    """A user or assistant message of the conversation, parsed from an item."""

    speaker: str
    text: str
    item_id: str | None = None
    tool_calls: tuple[ToolCall, ...] = field(default=())


class TurnlogRunHooks(RunHooks[Any]):
    """``RunHooks`` giving each model response's token usage to ``session``
    (``on_llm_end``: ``response.usage.input_tokens`` and ``output_tokens``, whole tokens)."""

    def __init__(self, session: TurnlogSession) -> None:
        self._session = session

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        usage = response.usage
        self._session._usage.input_tokens += int(usage.input_tokens or 0)
        self._session._usage.output_tokens += int(usage.output_tokens or 0)


class TurnlogSession:
    """A ``Session`` of the OpenAI Agents SDK that records the conversation in
    turnlog and keeps the items in ``inner``. Make it with :meth:`open`.

    ``session_id`` is the inner session's; ``recorded`` is the turnlog session
    (:class:`turnlog.producers.RecordedSession`). ``history`` holds the turns
    turnlog had when it was opened (empty for a new session).
    """

    def __init__(self, inner: Any, recorded: RecordedSession) -> None:
        self.inner = inner
        self.recorded = recorded
        self.session_id: str = inner.session_id
        self.hooks = TurnlogRunHooks(self)
        self._usage = _Usage()
        self._lock = asyncio.Lock()  # FIFO: writes reach turnlog and the inner session in call order
        self._writes: set[asyncio.Task[None]] = set()
        self._tool_calls: dict[str, dict[str, Any]] = {}  # call_id -> {"name", "arguments", "result"}, in call order
        self._streamed: dict[str, _Streamed] = {}  # item id -> open streamed assistant turn
        self._cut: set[str] = set()  # ids of streamed messages completed as cut short
        self._popped: list[str] = []  # canonical JSON of recorded items popped from the inner session

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
        """Resume ``inner.session_id`` in turnlog if turnlog has it, else start it;
        with ``rebuild``, add to ``inner`` the recorded turns it lacks (see the module docstring).

        Raises:
            SessionClosedError: turnlog has the session and it has ended.
            ResumeBarrierTimeout, SpoolError, InvalidTurnError: as
                ``SessionRecorder.resume`` and ``start_session``.
        """
        session_id = inner.session_id
        try:
            recorded = await recorder.resume(session_id)
        except SessionNotFoundError:
            recorded = await recorder.start_session(session_id, fleet=fleet, agent_id=agent_id, metadata=metadata)
        session = cls(inner, recorded)
        if rebuild and recorded.turns:
            await session._rebuild()
        return session

    # -- the Session protocol ------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The inner session's items (after the writes still running)."""
        async with self._lock:
            return await self.inner.get_items(limit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Record the user and assistant messages of ``items`` in turnlog, then save
        ``items`` in the inner session, in a task a cancellation does not stop.

        Raises:
            RecorderError: turnlog refused a turn (``InvalidTurnError``, ``SpoolFullError``...);
                the items are saved in the inner session all the same.
            Whatever the inner session's ``add_items`` raises.
        """
        write = asyncio.ensure_future(self._write(list(items)))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            write.add_done_callback(_log_failure)  # nobody awaits it now: a failure is logged
            raise

    async def pop_item(self) -> TResponseInputItem | None:
        """Pop the inner session's newest item; turnlog keeps what it recorded."""
        async with self._lock:
            item = await self.inner.pop_item()
            if item is not None:
                self._popped.append(_canonical(item))
            return item

    async def clear_session(self) -> None:
        """Clear the inner session; turnlog keeps what it recorded."""
        async with self._lock:
            self._popped.clear()
            await self.inner.clear_session()

    # -- streaming -----------------------------------------------------------
    async def stream(self, result: RunResultStreaming) -> AsyncIterator[StreamEvent]:
        """Yield ``result.stream_events()`` unchanged, recording the assistant's
        text deltas as the partial text of its open turn (one turn per output
        message item). When the stream ends, a streamed message the run did not
        save is completed ``barged_in=True`` with the text streamed so far."""
        try:
            async for event in result.stream_events():
                if isinstance(event, RawResponsesStreamEvent) and isinstance(event.data, ResponseTextDeltaEvent):
                    self._on_delta(event.data.item_id, event.data.delta)
                yield event
        finally:
            await self._settle_writes()
            async with self._lock:
                for item_id, streamed in list(self._streamed.items()):
                    del self._streamed[item_id]
                    self._cut.add(item_id)  # if the run saves it after all, it is recorded already
                    usage = self._take_usage()
                    await self.recorded.complete_turn(
                        streamed.turn_index, ASSISTANT, streamed.text, barged_in=True,
                        input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                    )

    # -- the turnlog session -------------------------------------------------
    async def end(self, reason: str = "completed") -> None:
        """Wait for the writes still running, then end the turnlog session
        (the inner session is left as it is). Raises as ``RecordedSession.end``."""
        await self._settle_writes()
        async with self._lock:
            await self.recorded.end(reason)

    # -- internals -----------------------------------------------------------
    def _on_delta(self, item_id: str, delta: str) -> None:
        streamed = self._streamed.get(item_id)
        if streamed is None:
            streamed = self._streamed[item_id] = _Streamed(self.recorded.next_turn_index)
        streamed.text += delta
        self.recorded.update_partial(streamed.turn_index, ASSISTANT, streamed.text)

    async def _settle_writes(self) -> None:
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    async def _write(self, items: list[TResponseInputItem]) -> None:
        async with self._lock:
            failure: BaseException | None = None
            try:
                for message in self._messages(items):
                    await self._record(message)
            except Exception as e:  # raised below, once the inner session has the items too
                failure = e
            await self.inner.add_items(items)
            if failure is not None:
                raise failure

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
                self._tool_calls[str(item.get("call_id"))] = {"name": item.get("name"),
                                                              "arguments": _arguments(item.get("arguments"))}
                continue
            if kind == "function_call_output":
                call = self._tool_calls.get(str(item.get("call_id")))
                if call is not None:
                    call["result"] = item.get("output")
                continue
            message = _message(item)
            if message is None:
                continue
            if message.speaker == ASSISTANT and self._tool_calls:
                calls = tuple(
                    ToolCall(name=c["name"], arguments=c["arguments"], result=c.get("result"))
                    for c in self._tool_calls.values()
                )
                self._tool_calls.clear()
                message = _Message(message.speaker, message.text, message.item_id, calls)
            messages.append(message)
        return messages

    async def _record(self, message: _Message) -> None:
        if message.item_id is not None and message.item_id in self._cut:
            self._cut.discard(message.item_id)
            return
        streamed = self._streamed.pop(message.item_id, None) if message.item_id is not None else None
        if streamed is None and message.speaker == ASSISTANT and self._streamed:
            # The ids differ (a model that sets none): the oldest first.
            streamed = self._streamed.pop(next(iter(self._streamed)))
        index = streamed.turn_index if streamed is not None else self.recorded.next_turn_index
        usage = self._take_usage() if message.speaker == ASSISTANT else _Usage()
        await self.recorded.complete_turn(
            index, message.speaker, message.text, tool_calls=message.tool_calls or None,
            input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
        )

    def _take_usage(self) -> _Usage:
        usage, self._usage = self._usage, _Usage()
        return usage

    async def _rebuild(self) -> None:
        stored = [
            (t.speaker, t.text)
            for t in self.recorded.turns
            if t.status == TurnStatus.COMPLETE and t.speaker in (USER, ASSISTANT)
        ]
        held = [(m.speaker, m.text) for m in map(_message, await self.inner.get_items()) if m is not None]
        start = _missing_from(held, stored)
        if start is None:
            logger.warning(
                "session %s: the inner session's %d messages differ from turnlog's %d turns; not rebuilt",
                self.session_id, len(held), len(stored),
            )
            return
        missing = [{"role": speaker, "content": text} for speaker, text in stored[start:]]
        if missing:
            await self.inner.add_items(missing)
            logger.info("session %s: rebuilt %d messages of the inner session from turnlog", self.session_id,
                        len(missing))


def _log_failure(write: asyncio.Task[None]) -> None:
    if not write.cancelled() and write.exception() is not None:
        logger.error("a session write whose caller was cancelled failed", exc_info=write.exception())


def _missing_from(held: list[tuple[str, str]], stored: list[tuple[str, str]]) -> int | None:
    """Where the turns ``held`` lacks start in ``stored``: 0 if it holds none; the
    position after the latest run of ``stored`` equal to ``held``; None if there is none."""
    if not held:
        return 0
    for end in range(len(stored), len(held) - 1, -1):
        if stored[end - len(held) : end] == held:
            return end
    return None


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


def _arguments(raw: Any) -> dict[str, Any]:
    """A function call's arguments as a JSON object (non-object JSON under ``"value"``, bad JSON under ``"raw"``)."""
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw else {}
    except ValueError:
        return {"raw": raw}
    return value if isinstance(value, dict) else {"value": value}


def _canonical(item: Any) -> str:
    return json.dumps(item, sort_keys=True, default=str)
