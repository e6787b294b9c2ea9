"""What the four framework adapters share: opening a session, the ordered writer,
token and tool-call accumulation, and the pieces of a rebuilt history.

- :func:`open_or_resume`: resume the session if turnlog has it, else start it.
- :class:`OrderedWriter`: frameworks that call back synchronously or from
  several tasks (LiveKit, Pipecat) put typed items on one queue in the order
  the framework produced them; one task applies them, so the recorder calls
  are made in that order.
- :class:`PendingUsage` and :class:`PendingToolCalls`: an LLM call's tokens
  and tool calls wait for the assistant turn they belong to (the next one
  completed).
- :func:`framework_ids`: a framework's own turn or conversation ids as trace
  attributes of the recorder's spans (bounded, empty ones left out).
- :func:`conversation` and :func:`after_latest_match`: which stored turns
  make up the conversation a framework is given back after a resume, and
  where a framework's own copy of it (an inner session, a checkpointer's
  state) stops matching turnlog's.

Nothing here imports a framework.
"""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from turnlog.producers import (
    RecordedSession,
    RecorderError,
    SessionErasedError,
    SessionNotFoundError,
    SessionRecorder,
    StoredTurn,
)
from turnlog.producers.recorder import MAX_TRACE_ATTRIBUTES, MAX_TRACE_ATTRIBUTES_BYTES, MAX_TRACE_VALUE_BYTES
from turnlog.schemas import ToolCall, TurnStatus

__all__ = [
    "ASSISTANT",
    "USER",
    "OpenedSession",
    "OrderedWriter",
    "PendingToolCalls",
    "PendingUsage",
    "after_latest_match",
    "arguments_object",
    "MAX_FRAMEWORK_ID_BYTES",
    "conversation",
    "framework_ids",
    "open_or_resume",
]

logger = logging.getLogger(__name__)

#: The speakers every adapter records (also the frameworks' message roles).
USER = "user"
ASSISTANT = "assistant"

Item = TypeVar("Item")
T = TypeVar("T")


# -- opening a session ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OpenedSession:
    """A session :func:`open_or_resume` opened: ``recorded``, and whether it was resumed
    (then ``recorded.turns`` holds the stored turns)."""

    recorded: RecordedSession
    resumed: bool


async def open_or_resume(
    recorder: SessionRecorder,
    session_id: str,
    *,
    fleet: str,
    agent_id: str,
    metadata: Mapping[str, Any] | None = None,
    resume: bool = True,
    resume_timeout: float | None = None,
) -> OpenedSession:
    """Resume fleet ``fleet``'s session ``session_id`` if turnlog has it (with ``resume``), else start it.
    Either way the session is keyed ``"<fleet>:<session_id>"`` (``recorded.session_id``).

    A resume waits at the resume barrier first (:meth:`SessionRecorder.resume`,
    up to ``resume_timeout`` seconds, default ``settings.resume_timeout_seconds``),
    so a new session costs one such check. ``agent_id`` and
    ``metadata`` are used only when the session is started.

    Raises:
        SessionClosedError: turnlog has the session and it has ended (it cannot be resumed).
        ResumeBarrierTimeout: the pipeline did not catch up in time (retry later).
        ConfigurationError: ``resume`` with a recorder that has no resume source (no
            ``TURNLOG_API_URL``, no ``resume_source``).
        InvalidTurnError, SpoolError, RecorderError: as :meth:`SessionRecorder.start_session`.
    """
    if resume:
        try:
            return OpenedSession(await recorder.resume(session_id, fleet=fleet, timeout=resume_timeout), resumed=True)
        except SessionNotFoundError:
            pass
    recorded = await recorder.start_session(session_id, fleet=fleet, agent_id=agent_id, metadata=metadata)
    return OpenedSession(recorded, resumed=False)


# -- the ordered writer ----------------------------------------------------------------
class OrderedWriter(Generic[Item]):
    """One asyncio task that applies queued items in the order they were put.

    ``apply(item)`` makes the recorder calls an item stands for. A
    :class:`RecorderError` it raises (a text over the size limit, a full spool)
    is logged with the session id and the item's type (never its content),
    kept in :attr:`errors`, and the writer goes on with the next item. Any
    other exception is a bug in the adapter: logged with its type and the line
    that raised it (its message may hold content), counted in :attr:`failures`
    too, and the writer goes on, so one bad event does not lose the rest of
    the conversation.

    A session forgotten while it is recorded (:class:`SessionErasedError`: the
    erasure ledger names it) refuses every later item alike: that is logged
    once, kept once in :attr:`errors`, and :attr:`erased` is set; the items
    after it are still applied (the adapter's own bookkeeping runs) and their
    refusals are not logged or kept again.

    :meth:`put` with ``last=True`` queues the final item: the writer applies it,
    then runs ``on_stop`` (e.g. closes a recorder the adapter made) and stops;
    items put after it are dropped. The task starts at the first :meth:`put`
    (it needs a running event loop); :meth:`wait_closed` may be awaited before
    that and returns once the writer has stopped.
    """

    def __init__(
        self,
        session_id: str,
        apply: Callable[[Item], Awaitable[None]],
        *,
        name: str,
        on_stop: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.session_id = session_id
        #: The recorder errors the writer logged and went past (newest last).
        self.errors: list[RecorderError] = []
        #: Items not recorded: recorder errors and adapter bugs.
        self.failures = 0
        #: True once the session was found forgotten (SessionErasedError).
        self.erased = False
        self._apply = apply
        self._name = name
        self._on_stop = on_stop
        self._queue: asyncio.Queue[tuple[Item, bool]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # Set when the task has stopped (after the last item and ``on_stop``, or cancelled).
        self._closed = asyncio.Event()

    @property
    def stopping(self) -> bool:
        """True once the last item was put: later items are dropped."""
        return self._stopping

    @property
    def closed(self) -> bool:
        """True once the writer applied the last item and stopped."""
        return self._closed.is_set()

    def put(self, item: Item, *, last: bool = False) -> None:
        """Queue ``item``; with ``last``, the writer stops after it. Dropped (logged at
        DEBUG) after the last item."""
        if self._stopping:
            logger.debug("session %s: %s after the last item; not recorded", self.session_id, type(item).__name__)
            return
        self._stopping = last
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)
        self._queue.put_nowait((item, last))

    async def drained(self) -> None:
        """Until every item put so far has been applied (or the writer stopped)."""
        task = self._task
        if task is None or task.done():
            return
        joined = asyncio.ensure_future(self._queue.join())
        try:
            await asyncio.wait({joined, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            joined.cancel()

    async def wait_closed(self, timeout: float | None = None) -> bool:
        """Until the writer applied the last item, ran ``on_stop`` and stopped, whether or
        not anything was put yet; False if ``timeout`` seconds passed first (None: no limit)."""
        if self._closed.is_set():
            return True
        try:
            await asyncio.wait_for(self._closed.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _run(self) -> None:
        try:
            while True:
                item, last = await self._queue.get()
                try:
                    await self._apply(item)
                except SessionErasedError as e:  # every item after it is refused alike: told once
                    self.failures += 1
                    if not self.erased:
                        self.erased = True
                        self.errors.append(e)
                        logger.warning("session %s was forgotten: %s and every later item not recorded",
                                       self.session_id, type(item).__name__)
                except RecorderError as e:  # its message names values and sizes, never content
                    self.errors.append(e)
                    self.failures += 1
                    logger.error("session %s: %s not recorded: %s", self.session_id, type(item).__name__, e)
                except Exception as e:  # a bug's message may hold content: its type and place only
                    self.failures += 1
                    place = traceback.extract_tb(e.__traceback__)[-1]
                    logger.error("session %s: %s not recorded: %s at %s:%s", self.session_id, type(item).__name__,
                                 type(e).__name__, place.filename, place.lineno)
                finally:
                    self._queue.task_done()
                if last:
                    return
        finally:
            try:
                if self._on_stop is not None:
                    await self._on_stop()
            finally:
                self._closed.set()


# -- tokens and tool calls waiting for their turn ------------------------------------------
@dataclass(slots=True)
class PendingUsage:
    """LLM tokens not yet given to an assistant turn: an LLM call that produced no
    turn of its own (one that only called tools, one whose reply was dropped)
    adds its tokens to the next assistant turn completed."""

    input_tokens: int = 0
    output_tokens: int = 0

    def add(self, input_tokens: int | None, output_tokens: int | None) -> None:
        """Add a call's tokens (None counts as 0)."""
        self.input_tokens += int(input_tokens or 0)
        self.output_tokens += int(output_tokens or 0)

    def take(self) -> tuple[int, int]:
        """``(input_tokens, output_tokens)`` so far, and start again from zero."""
        taken = (self.input_tokens, self.output_tokens)
        self.input_tokens = self.output_tokens = 0
        return taken


@dataclass(slots=True)
class PendingToolCalls:
    """Tool calls (and their results) not yet given to an assistant turn, in call
    order, by the framework's call id."""

    _calls: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self._calls)

    def call(self, call_id: str, name: str, arguments: Any) -> None:
        """A call the model made; ``arguments`` as :func:`arguments_object` reads them."""
        self._calls[call_id] = {"name": name, "arguments": arguments_object(arguments)}

    def result(self, call_id: str, result: Any) -> bool:
        """The result of call ``call_id``; False if no such call is pending."""
        call = self._calls.get(call_id)
        if call is None:
            return False
        call["result"] = result
        return True

    def take(self) -> tuple[ToolCall, ...]:
        """The pending calls as :class:`ToolCall` values, and start again from none. Never
        raises: an argument or a result that is no valid free-form value (over the schema's
        ``MAX_TOOL_VALUE_BYTES``, nested too deep, not JSON-encodable) is replaced by
        :func:`omitted` (a warning names the tool, never the value), so one tool's output
        never costs the turn it belongs to."""
        pending, self._calls = list(self._calls.values()), {}
        calls = []
        for call in pending:
            name, arguments, result = call["name"], call["arguments"], call.get("result")
            tries = ((arguments, result), (arguments, omitted(result)), (omitted(arguments), result),
                     (omitted(arguments), omitted(result)))
            for number, (kept_arguments, kept_result) in enumerate(tries):
                try:
                    calls.append(ToolCall(name=name, arguments=kept_arguments, result=kept_result))
                    break
                except (ValueError, TypeError) as e:
                    if number == 0:
                        logger.warning("tool call %r: a value left out of the turn (%s)", name, e)
        return tuple(calls)


def omitted(value: Any) -> dict[str, Any]:
    """What a tool call keeps of a value the schema refuses: ``{"omitted": "<type>"}``."""
    return {"omitted": type(value).__name__}


def arguments_object(raw: Any) -> dict[str, Any]:
    """A tool call's arguments as a JSON object: a mapping as it is, a JSON string
    decoded (a non-object value under ``"value"``, text that is not JSON under
    ``"raw"``), nothing as ``{}``."""
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw else {}
    except ValueError:
        return {"raw": raw}
    return value if isinstance(value, dict) else {"value": value}


# -- the framework's ids on the recorder's spans ------------------------------------------
#: The longest framework id put on a span (UTF-8 bytes): the recorder's bound on a trace
#: attribute's value. A longer one is left out, not cut (a cut id would join nothing). The
#: ids the adapters read are far shorter (LiveKit's ``SH_<12>``, a room sid, a uuid,
#: ``trace_<32 hex>``); a LangGraph ``thread_id`` is the caller's.
MAX_FRAMEWORK_ID_BYTES = MAX_TRACE_VALUE_BYTES


def framework_ids(ids: Mapping[str, object], *, beside: Mapping[str, object] | None = None) -> dict[str, str]:
    """``ids`` (attribute key -> a framework's id) as the trace attributes an adapter passes to
    :meth:`RecordedSession.complete_turn` (``trace_attributes``) or
    :meth:`RecordedSession.set_trace_attributes`, so the recorder never refuses a turn for a
    framework's id: each value that is a non-empty ``str`` of valid Unicode of at most
    :data:`MAX_FRAMEWORK_ID_BYTES` UTF-8 bytes; any other value (None, empty, too long, a
    lone surrogate, another type) is left out.

    ``beside``: the attributes the span has already (the session's,
    ``RecordedSession.trace_attributes``, some perhaps set by the application). An id that
    would take the span past the recorder's bounds with them (``MAX_TRACE_ATTRIBUTES``
    attributes, ``MAX_TRACE_ATTRIBUTES_BYTES`` of names and values, counted as the recorder
    counts them) is left out too, in the order of ``ids``.

    The keys are the ones the framework puts on its own spans, so a join with them is a
    plain equality."""
    merged = dict(beside or {})
    chosen: dict[str, str] = {}
    for key, value in ids.items():
        if not isinstance(value, str) or not value:
            continue
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            continue
        if size > MAX_FRAMEWORK_ID_BYTES:
            continue
        trial = {**merged, key: value}
        if len(trial) <= MAX_TRACE_ATTRIBUTES and _attributes_bytes(trial) <= MAX_TRACE_ATTRIBUTES_BYTES:
            merged = trial
            chosen[key] = value
    return chosen


def _attributes_bytes(attributes: Mapping[str, object]) -> int:
    """Span attributes' size as the recorder counts it: each name's length and its value's
    (UTF-8 bytes of a str, 1 for a bool, 8 for an int)."""
    size = 0
    for key, value in attributes.items():
        if isinstance(value, str):
            length = len(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, bool):
            length = 1
        else:
            length = 8
        size += len(key) + length
    return size


# -- the rebuilt history ---------------------------------------------------------------
def conversation(turns: Iterable[StoredTurn], *, unfinished: bool, with_calls: bool = False) -> list[StoredTurn]:
    """The stored turns a framework is given back after a resume, in ``turn_index`` order:
    turns of speaker ``"user"`` or ``"assistant"`` with text (with ``with_calls``, also an
    assistant turn with tool calls and no text); with ``unfinished`` also those a crash left
    open (status ``partial`` or ``interrupted``), else only ``complete`` ones."""
    return [
        t for t in sorted(turns, key=lambda t: t.turn_index)
        if t.speaker in (USER, ASSISTANT) and (unfinished or t.status == TurnStatus.COMPLETE)
        and (t.text or (with_calls and t.speaker == ASSISTANT and t.tool_calls))
    ]


def after_latest_match(known: Sequence[T], sequence: Sequence[T]) -> int | None:
    """Where the part of ``sequence`` past ``known`` begins: the position in
    ``sequence`` right after its latest stretch that ends like ``known`` (all of
    ``known``, or its tail where ``sequence`` begins later, as a trimmed
    history does); 0 if ``known`` is empty; None if no stretch matches (one of
    the two was edited).

    E.g. ``known`` = turnlog's turns, ``sequence`` = a checkpointer's messages:
    ``sequence[pos:]`` are the messages turnlog lacks. Or ``known`` = an inner
    session's messages, ``sequence`` = turnlog's turns: ``sequence[pos:]`` are
    the turns the inner session lacks.
    """
    if not known:
        return 0
    for end in range(len(sequence), 0, -1):
        n = min(end, len(known))
        if list(sequence[end - n : end]) == list(known[len(known) - n :]):
            return end
    return None
