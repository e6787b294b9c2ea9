"""LangGraph adapter: mirror a graph's message stream into turnlog, beside your own checkpointer.

Usage (``pip install 'turnlog[langgraph]'``)::

    graph = builder.compile(checkpointer=AsyncPostgresSaver(...))   # your checkpointer stays
    async with SessionRecorder(TurnlogSettings()) as recorder:
        mirror = await LangGraphMirror.open(recorder, "thread-42", fleet="support", agent_id="bot-7")
        config = {"configurable": {"thread_id": "thread-42"}}
        async for mode, chunk in mirror.astream(graph, {"messages": [("user", "hi")]}, config):
            ...                                    # ("messages", (chunk, metadata)) and ("updates", {...})
        await mirror.end("completed")

**Why not a checkpointer.** A LangGraph checkpointer must serve
``get_tuple``/``aget_tuple`` with read-your-writes: the graph reads the
checkpoint it has just ``put`` (with its pending writes and channel
versions) at the start of every invocation and after an interrupt. turnlog
cannot: an event is durable once the broker acknowledges it, but it becomes
readable only when the sequencer and the sink have applied it (asynchronously,
typically milliseconds, seconds under a backlog). A checkpointer on turnlog
would serve stale state (the graph would re-run nodes or drop messages) or
block each superstep on the whole pipeline. turnlog also stores
conversation turns, not arbitrary channel values. So the graph keeps its own
checkpointer, and this module mirrors the conversation into turnlog.

**What it records: the messages the graph holds.** :meth:`LangGraphMirror.astream` runs
``graph.astream(input, config, stream_mode=["messages", "updates", ...])``
and yields every ``(mode, chunk)`` pair unchanged:

- each ``HumanMessage`` of the input's ``messages`` is a completed ``user``
  turn, recorded before the graph runs. An input message without an id is
  given one (a uuid4, as ``langgraph.graph.message.add_messages`` would), and
  the graph gets the messages with those ids, so the same message written
  back by a node (one that returns the whole list) is known by its id;
- ``"messages"`` mode: each ``AIMessageChunk`` adds its text to the open
  ``assistant`` turn of its message id (the whole text so far, flushed by the
  recorder's timer); ``partial_nodes`` restricts this to some nodes
  (``metadata["langgraph_node"]``);
- ``"updates"`` mode (``{node: write}``, written when the node finished): each
  ``AIMessage`` with text that a node writes to the ``messages`` key is a
  completed ``assistant`` turn, at the index of its streamed partial: the one
  of the same message id, else the latest one that node streamed (a node that
  wraps the model's output in a new ``AIMessage``). Tokens come from
  ``usage_metadata`` (``input_tokens``, ``output_tokens``). The turn is
  completed at the graph's next update (or when the stream ends): until then a
  node may replace the message by its id, as ``add_messages`` does, and the turn
  gets the replacement's text (review and edit: ``interrupt()`` with the draft,
  then an ``AIMessage`` with the draft's id). A stream that ends on an
  ``interrupt()`` (an ``__interrupt__`` update) keeps the turn open, its text
  spooled, until the run is resumed; a ``RemoveMessage`` of its id empties it
  (no turn). A ``HumanMessage`` a node writes is a completed ``user`` turn. A
  message id already recorded is not recorded again (a node that returns the whole list).
- a ``Command`` input: the ``HumanMessage``s of its ``update``
  (``Command(resume=..., update={"messages": [...]})``) are ``user`` turns, recorded
  before the graph runs, as an input's are.
- a summary LangChain's ``SummarizationMiddleware`` writes (a ``HumanMessage``
  with ``additional_kwargs["lc_source"] == "summarization"``, langchain 1.3.0 on)
  is a ``user`` turn of kind ``summary`` (``TurnKind.SUMMARY``), recorded once per
  text; the middleware's own model call is no partial (``metadata["lc_source"]``).
- a streamed message that its node did not write when it finished (a router's
  or a classifier's model call) is not a turn: its open turn is emptied and
  its index reused by the next assistant turn (if no turn came after it; else
  the empty turn stays open, and :meth:`LangGraphMirror.end` leaves it
  ``interrupted``). ``partial_nodes`` keeps such a call's text out of the
  partials too.
- tool calls: an ``AIMessage`` that only calls tools is not a turn: its
  ``tool_calls`` (with the ``ToolMessage`` contents as results) and its tokens
  go to the next assistant turn. An ``AIMessage`` with text and tool calls (a
  preamble: "let me check") is a turn with those calls, completed once every
  call has its ``ToolMessage`` (or when the model talks again, a user turn
  comes, the stream is cut, or :meth:`LangGraphMirror.end`).
- a streamed message still open when the stream ends is completed as it is,
  ``barged_in=True``, if the stream was cut short (the caller stopped
  iterating, a cancellation, an exception): the words the user saw. A caller
  that stops iterating early closes the stream (``async with
  contextlib.aclosing(mirror.astream(...))``), so this happens at once rather
  than when the generator is garbage-collected. If the stream finished, no
  node wrote it: it is dropped as above.

Text is the message's ``content`` string, or the concatenated ``text`` of
its ``{"type": "text"}`` blocks. ``subgraphs=True`` and ``version="v2"`` are
refused (the stream's shape changes). System messages are not recorded.
Updates name the node, not its task (``langgraph.pregel``'s v1 ``"updates"``
mode): when several tasks of one node stream at once (``Send``), the first
to finish empties the others' open turns, and their messages are recorded
at fresh indexes when written (an emptied turn no later turn reused is left
``interrupted``, with no text).

**Traces.** Each turn's span carries the graph's thread id (``config["configurable"]["thread_id"]``
of the :meth:`LangGraphMirror.astream` that recorded it) under
``langsmith.metadata.thread_id``: LangGraph copies ``thread_id`` into every
run's metadata (``langgraph/_internal/_config.py``), and LangSmith's
OpenTelemetry exporter writes a run's metadata as ``langsmith.metadata.<key>``,
so the graph's spans carry the same attribute. A no-op when turnlog's tracing
is off.

**Resume.** :meth:`LangGraphMirror.open` resumes the session (thread) if
turnlog has it (``SessionRecorder.resume``: the resume barrier, a new epoch)
and starts it otherwise; :attr:`LangGraphMirror.history` holds the stored
complete turns as ``HumanMessage``/``AIMessage`` objects, each assistant turn's
tool calls before it as the ``AIMessage`` that made them and their
``ToolMessage`` results (no summaries, no turn kept out of the LLM's context:
``StoredTurn.in_context``). On the first
:meth:`LangGraphMirror.astream` after a resume, if the graph has a
checkpointer and the thread's state holds no messages (the checkpointer lost
it: an in-memory saver, a new database), the history is put in front of the
input's messages, so the graph continues the conversation; they are not
recorded again. If the state holds messages past turnlog's last complete
turn (the process was killed after the checkpointer saved a message but
before its update reached turnlog), they are recorded first (matched by
speaker and text: turnlog does not store message ids; summaries are left out
of the match, and one the state holds that turnlog lacks is recorded before
the first answer past turnlog). A state that differs
from turnlog is left alone, with a warning. A graph without a checkpointer
gets ``history`` from the caller. The comparison is made again by each
:meth:`LangGraphMirror.astream` until one after it finishes: a stream cut
short or failed (``aget_state`` raising, a cancellation, the graph raising
before it saved its input) may leave the checkpointer without the rebuilt
history. Messages recorded already (by message id) are not recorded again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, RemoveMessage, ToolMessage
from langchain_core.messages.utils import convert_to_messages
from langgraph.types import Command

from turnlog.adapters._core import (
    ASSISTANT,
    USER,
    PendingToolCalls,
    PendingUsage,
    after_latest_match,
    conversation,
    framework_ids,
    open_or_resume,
)
from turnlog.producers import RecordedSession, SessionRecorder, StoredTurn
from turnlog.schemas import ToolCall, TurnKind

__all__ = ["ASSISTANT", "THREAD_ID_ATTRIBUTE", "USER", "LangGraphMirror"]

logger = logging.getLogger(__name__)

#: The trace attribute of a turn's span that holds the graph's thread id: the key LangSmith's
#: OpenTelemetry exporter gives the ``thread_id`` LangGraph puts in every run's metadata.
THREAD_ID_ATTRIBUTE = "langsmith.metadata.thread_id"

_MODES = ("messages", "updates")
#: The key of the ``updates`` chunk LangGraph streams when a node called ``interrupt()``.
_INTERRUPT = "__interrupt__"
#: ``additional_kwargs["lc_source"]`` of the summary ``HumanMessage`` LangChain's
#: ``SummarizationMiddleware`` writes (langchain 1.3.0 on), and the ``metadata["lc_source"]``
#: of its summarizer's model call.
_SUMMARY_SOURCE = "summarization"


@dataclass(slots=True)
class _Streamed:
    """A message streaming into an open assistant turn: its index, the node streaming it, the text so far."""

    turn_index: int
    node: str | None
    text: str = ""


@dataclass(slots=True)
class _Held:
    """An assistant message a node wrote, whose turn is completed at the graph's next update
    (or the stream's end): until then a node may still replace it (``add_messages`` by id)."""

    turn_index: int
    message_id: str | None
    text: str
    tokens: tuple[int, int]
    tool_calls: list[ToolCall] | None


@dataclass(slots=True)
class _Preamble:
    """An assistant turn with text that called tools, waiting for the results of ``waiting`` (call ids)."""

    turn_index: int
    text: str
    tokens: tuple[int, int]
    waiting: set[str] = field(default_factory=set)


class LangGraphMirror:
    """Records one LangGraph thread's conversation in turnlog. Make it with :meth:`open`.

    ``recorded`` is the turnlog session; ``messages_key`` is the state key of
    the conversation (``"messages"``, as in ``MessagesState``); ``partial_nodes``
    (None: all) the nodes whose streamed text is recorded as partial text.
    ``resumed``: the session was resumed (the first :meth:`astream` compares
    turnlog with the checkpointer).
    """

    def __init__(
        self,
        recorded: RecordedSession,
        *,
        messages_key: str = "messages",
        partial_nodes: Collection[str] | None = None,
        resumed: bool | None = None,
    ) -> None:
        self.recorded = recorded
        self.messages_key = messages_key
        self.partial_nodes = None if partial_nodes is None else frozenset(partial_nodes)
        self._streamed: dict[str, _Streamed] = {}  # message id -> open assistant turn
        self._vacant: set[int] = set()  # open assistant turns emptied (their message was not written)
        self._seen: set[str] = set()  # message ids recorded (or rebuilt from turnlog)
        self._calls = PendingToolCalls()  # by tool call id, for the next assistant turn (or the preamble)
        self._usage = PendingUsage()  # tokens of tool-calling messages, for the next assistant turn
        self._preamble: _Preamble | None = None
        self._held: _Held | None = None
        self._carried: list[ToolCall] = []  # tool calls of a removed held message, for the next assistant turn
        self._interrupted = False  # the current stream ended on an interrupt(): a held message waits
        # the texts of the summaries recorded (a summary written again as a preserved message is not a new one)
        self._summaries = {t.text for t in recorded.turns if t.kind == TurnKind.SUMMARY}
        self._thread_id: Any = None  # config["configurable"]["thread_id"] of the latest astream, for the spans
        # compare turnlog with the checkpointer, until a stream after the resume finishes
        self._resumed = recorded.epoch > 0 if resumed is None else resumed

    @classmethod
    async def open(
        cls,
        recorder: SessionRecorder,
        thread_id: str,
        *,
        fleet: str,
        agent_id: str,
        metadata: Mapping[str, Any] | None = None,
        messages_key: str = "messages",
        partial_nodes: Collection[str] | None = None,
    ) -> LangGraphMirror:
        """Resume ``thread_id`` in turnlog if turnlog has it, else start it (the turnlog session is ``fleet``'s
        session of the thread id, keyed ``"<fleet>:<thread_id>"``).

        Raises:
            SessionClosedError: turnlog has the session and it has ended.
            ResumeBarrierTimeout, SpoolError, InvalidTurnError: as
                ``SessionRecorder.resume`` and ``start_session``.
        """
        opened = await open_or_resume(recorder, thread_id, fleet=fleet, agent_id=agent_id, metadata=metadata)
        return cls(opened.recorded, messages_key=messages_key, partial_nodes=partial_nodes, resumed=opened.resumed)

    @property
    def history(self) -> list[BaseMessage]:
        """The complete turns turnlog held at the resume, as the graph's messages: ``HumanMessage``
        (user) and ``AIMessage`` (assistant) objects with ids ``turnlog-<turn_index>``; other
        speakers, summaries (kind ``summary``: a summarization middleware summarizes the turns
        again) and turns kept out of the LLM's context (``StoredTurn.in_context`` False) are left
        out. An assistant turn's tool calls are one ``AIMessage`` with every call (``tool_calls``, ids
        ``turnlog-<turn_index>-<n>``; the framework's own are not stored), then a ``ToolMessage`` per
        call with its stored result (a string as it is, another value as JSON, none as ``""``). They
        come before the turn's text, as a graph holds a call made before its answer; a turn another
        assistant turn follows was a preamble ("let me check"): its text is the message that made
        the calls."""
        messages: list[BaseMessage] = []
        context = _context(self.recorded.turns, with_calls=True)
        for turn, following in zip(context, [*context[1:], None], strict=True):
            if turn.speaker == ASSISTANT and turn.tool_calls:
                preamble = following is not None and following.speaker == ASSISTANT
                messages.extend(_tool_exchange(turn, preamble=preamble))
                if preamble:
                    continue
            if turn.text:
                kind = HumanMessage if turn.speaker == USER else AIMessage
                messages.append(kind(content=turn.text, id=f"turnlog-{turn.turn_index}"))
        return messages

    async def astream(
        self,
        graph: Any,
        input: Any,
        config: Mapping[str, Any] | None = None,
        *,
        stream_mode: str | Sequence[str] = (),
        **kwargs: Any,
    ) -> AsyncIterator[tuple[str, Any]]:
        """Run ``graph.astream`` with ``stream_mode`` ``["messages", "updates", *stream_mode]``,
        record the conversation (module docstring) and yield each ``(mode, chunk)``.

        ``input`` is the graph's input: a mapping whose ``messages_key`` holds
        the new messages (message objects, ``(role, text)`` tuples or dicts), or
        a ``Command``/None (nothing recorded from it). The graph is given the
        input's messages as message objects, each with an id. ``kwargs`` go to
        ``graph.astream``.

        Raises:
            ValueError: ``subgraphs=True`` or ``version="v2"`` (another stream shape).
            RecorderError: turnlog refused a turn; what the graph raises.
        """
        if kwargs.get("subgraphs") or kwargs.get("version", "v1") != "v1":
            raise ValueError(
                "LangGraphMirror reads the v1 stream without subgraphs: no subgraphs=True, no version='v2'"
            )
        self._thread_id = _thread_id(config)
        self._interrupted = False
        input = await self._reconcile(graph, input, config)
        input, new = self._input_messages(input)
        for message in new:
            # a Command's messages join the state of an interrupted run: a held message may still be replaced
            await self._complete(message, settle=not isinstance(input, Command))
        extra = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
        modes = list(dict.fromkeys([*_MODES, *extra]))
        finished = False
        try:
            async with aclosing(graph.astream(input, config, stream_mode=modes, **kwargs)) as stream:
                async for mode, chunk in stream:
                    if mode == "messages":
                        self._on_chunk(*chunk)
                    elif mode == "updates":
                        await self._on_update(chunk)
                    yield mode, chunk
            finished = True
        finally:
            await self._stream_ended(finished)

    async def end(self, reason: str = "completed") -> None:
        """End the turnlog session (the graph's thread is left as it is), after completing a
        preamble turn still waiting for tool results and a message held across an interrupt
        (as the thread holds it). Raises as ``RecordedSession.end``."""
        await self._settle()
        await self.recorded.end(reason)

    # -- internals -----------------------------------------------------------
    async def _reconcile(self, graph: Any, input: Any, config: Mapping[str, Any] | None) -> Any:
        """Until a stream after a resume finishes, with a checkpointer: compare the
        thread's state with turnlog (module docstring, Resume); ``input``, with the
        rebuilt history in front of its messages if the state holds none."""
        if not self._resumed:
            return input
        self._seen.update(m.id for m in self.history if m.id)
        if getattr(graph, "checkpointer", None) is None:
            self._resumed = False
            return input
        state = await graph.aget_state(config)
        held = convert_to_messages((state.values or {}).get(self.messages_key) or [])
        if held:
            await self._catch_up(held)
            return input
        history = self.history
        if not history or not isinstance(input, Mapping):
            return input
        logger.info("thread %s: the checkpointer holds no messages; %d rebuilt from turnlog", self.recorded.session_id,
                    len(history))
        return {**input, self.messages_key: [*history, *_as_list(input.get(self.messages_key))]}

    async def _catch_up(self, held: Sequence[BaseMessage]) -> None:
        """Record the messages of ``held`` (the checkpointer's) after the latest run of
        its conversation messages equal to turnlog's complete turns; none if they differ."""
        said = [i for i, m in enumerate(held)
                if isinstance(m, (HumanMessage, AIMessage)) and _text(m) and not _is_summary(m)]
        pairs = [(USER if isinstance(held[i], HumanMessage) else ASSISTANT, _text(held[i])) for i in said]
        stored = [(t.speaker, t.text) for t in _context(self.recorded.turns)]
        start = after_latest_match(stored, pairs)
        if start is None:
            logger.warning(
                "thread %s: the checkpointer's %d messages differ from turnlog's %d turns; none recorded from it",
                self.recorded.session_id, len(pairs), len(stored),
            )
            self._seen.update(m.id for m in held if m.id)
            return
        first = said[start] if start < len(said) else len(held)  # the first message turnlog lacks
        # a summary the middleware wrote past turnlog stands first in the state (it replaced
        # the messages before it): recorded before the first answer past turnlog
        summaries = [m for m in held[:first] if _is_summary(m) and _text(m) not in self._summaries]
        self._seen.update(m.id for m in held[:first] if m.id and m not in summaries)
        if first < len(held) or summaries:
            logger.info("thread %s: %d messages of the checkpointer were not in turnlog; recorded",
                        self.recorded.session_id, len(held) - first + len(summaries))
        for message in held[first:]:
            if summaries and isinstance(message, AIMessage):
                for summary in summaries:
                    await self._complete(summary)
                summaries = []
            await self._complete(message)
        for summary in summaries:
            await self._complete(summary)

    def _input_messages(self, input: Any) -> tuple[Any, list[BaseMessage]]:
        """``input`` with its messages as message objects, each with an id; and those to record.
        A ``Command``'s messages are those of its ``update`` (a mapping, or ``(key, value)`` pairs)."""
        if isinstance(input, Command):
            update = input.update
            if isinstance(update, Mapping):
                written, given = self._input_messages(update)
                return dataclasses.replace(input, update=written), given
            if isinstance(update, (list, tuple)) and all(isinstance(p, tuple) and len(p) == 2 for p in update):
                pairs: list[tuple[Any, Any]] = []
                new: list[BaseMessage] = []
                for key, value in update:
                    if key == self.messages_key and value is not None:
                        value, found = self._input_messages({key: value})
                        value = value[key]
                        new.extend(found)
                    pairs.append((key, value))
                return dataclasses.replace(input, update=pairs), new
            return input, []
        if not isinstance(input, Mapping) or input.get(self.messages_key) is None:
            return input, []
        messages = [
            m if m.id else m.model_copy(update={"id": str(uuid.uuid4())})
            for m in _as_list(input[self.messages_key])
        ]
        recorded: list[BaseMessage] = [m for m in messages if isinstance(m, HumanMessage) and m.id not in self._seen]
        return {**input, self.messages_key: messages}, recorded

    def _on_chunk(self, message: Any, metadata: Mapping[str, Any]) -> None:
        if not isinstance(message, AIMessageChunk) or not message.id or message.id in self._seen:
            return
        node = metadata.get("langgraph_node")
        if self.partial_nodes is not None and node not in self.partial_nodes:
            return
        if metadata.get("lc_source") == _SUMMARY_SOURCE:
            return  # the summarization middleware's own model call: not a turn
        text = _text(message)
        if not text:
            return
        streamed = self._streamed.get(message.id)
        if streamed is None:
            streamed = self._streamed[message.id] = _Streamed(self._assistant_index(), node)
        streamed.text += text
        self.recorded.update_partial(streamed.turn_index, ASSISTANT, streamed.text)

    async def _on_update(self, update: Any) -> None:
        if not isinstance(update, Mapping):
            return
        if _INTERRUPT in update:
            self._interrupted = True
        if self._held is not None and any(node != _INTERRUPT for node in update):
            await self._settle_held(self._written_messages(update))
        for node, written in update.items():  # {node: its write}; a write may be None or a list of writes
            for write in written if isinstance(written, list) else [written]:
                if isinstance(write, Mapping) and write.get(self.messages_key) is not None:
                    for message in _as_list(write[self.messages_key]):
                        await self._complete(message, node=node)
            self._drop_unwritten(node)

    async def _stream_ended(self, finished: bool) -> None:
        """Complete (cut short) or drop (finished: no node wrote it) the messages still streaming;
        complete a held message, unless the graph is interrupted (then spool its text now)."""
        if finished:
            self._resumed = False  # the graph holds the conversation now: no more comparisons
        else:
            await self._finish_preamble()
        if self._held is not None:
            if finished and self._interrupted:
                await self.recorded.flush_partial()
            else:
                await self._settle_held()
        for message_id, streamed in list(self._streamed.items()):
            if finished:
                self._drop(message_id)
            else:
                del self._streamed[message_id]
                self._seen.add(message_id)
                await self.recorded.complete_turn(streamed.turn_index, ASSISTANT, streamed.text, barged_in=True,
                                                  trace_attributes=self._trace_ids())

    def _drop_unwritten(self, node: str) -> None:
        """``node`` finished: what it streamed and did not write is not part of the conversation."""
        for message_id in [i for i, s in self._streamed.items() if s.node == node]:
            self._drop(message_id)

    def _drop(self, message_id: str) -> None:
        streamed = self._streamed.pop(message_id)
        self.recorded.update_partial(streamed.turn_index, ASSISTANT, "")
        self._vacant.add(streamed.turn_index)

    def _trace_ids(self) -> dict[str, str] | None:
        """The thread id as a turn span's attributes (None if the config had none)."""
        return framework_ids({THREAD_ID_ATTRIBUTE: self._thread_id}, beside=self.recorded.trace_attributes) or None

    def _assistant_index(self) -> int:
        """A fresh turn index for an assistant turn: an emptied one if no turn came after it."""
        top = self.recorded.next_turn_index - 1
        if top in self._vacant:
            self._vacant.discard(top)
            return top
        return self.recorded.next_turn_index

    def _streamed_for(self, message: AIMessage, node: str | None) -> _Streamed | None:
        """The open turn ``message`` completes: the one of its id, else the latest ``node`` streamed."""
        if message.id and message.id in self._streamed:
            return self._streamed.pop(message.id)
        mine = [(s.turn_index, i) for i, s in self._streamed.items() if node is not None and s.node == node]
        if not mine:
            return None
        message_id = max(mine)[1]
        self._seen.add(message_id)
        return self._streamed.pop(message_id)

    async def _complete(self, message: BaseMessage, *, node: str | None = None, settle: bool = True) -> None:
        if message.id:
            if message.id in self._seen:
                return
            self._seen.add(message.id)
        if isinstance(message, ToolMessage):
            await self._tool_result(message)
        elif isinstance(message, HumanMessage):
            text = _text(message)
            kind = None
            if _is_summary(message):
                if text in self._summaries:
                    return  # a summary written again (a preserved message, a catch-up): recorded once
                self._summaries.add(text)
                kind = TurnKind.SUMMARY
            if settle:
                await self._settle()
            else:
                await self._finish_preamble()
            await self.recorded.complete_turn(self.recorded.next_turn_index, USER, text, kind=kind,
                                              trace_attributes=self._trace_ids())
        elif isinstance(message, AIMessage):
            await self._assistant(message, node)

    async def _assistant(self, message: AIMessage, node: str | None) -> None:
        usage: Mapping[str, Any] = message.usage_metadata or {}
        self._usage.add(usage.get("input_tokens"), usage.get("output_tokens"))
        text = _text(message)
        streamed = self._streamed_for(message, node) if text else None
        if text:
            await self._settle()  # the model talks again: an earlier preamble's or held message's turn is over
        for tool_call in message.tool_calls:
            self._calls.call(str(tool_call.get("id")), tool_call["name"], tool_call.get("args"))
        if not text:
            return  # a tool-calling message: its calls and tokens go with the next assistant turn
        index = streamed.turn_index if streamed is not None else self._assistant_index()
        if message.tool_calls:  # a preamble: its turn waits for its tools' results
            self._preamble = _Preamble(index, text, self._usage.take(), {str(c.get("id")) for c in message.tool_calls})
            self.recorded.update_partial(index, ASSISTANT, text)
            return
        # held until the graph's next update: a review step after an interrupt() may replace it
        self._held = _Held(index, message.id, text, self._usage.take(), self._take_calls())
        self.recorded.update_partial(index, ASSISTANT, text)

    def _written_messages(self, update: Mapping[str, Any]) -> list[BaseMessage]:
        """The messages the nodes of ``update`` write to the conversation."""
        messages: list[BaseMessage] = []
        for written in update.values():
            for write in written if isinstance(written, list) else [written]:
                if isinstance(write, Mapping) and write.get(self.messages_key) is not None:
                    messages.extend(_as_list(write[self.messages_key]))
        return messages

    async def _settle_held(self, written: Sequence[BaseMessage] = ()) -> None:
        """Complete the held message's turn with the text the state holds: that of a message
        of ``written`` with its id (a reviewer's edit, which ``add_messages`` puts in its
        place); if ``written`` removes it (``RemoveMessage``), its turn is emptied (no turn,
        as a router's call) and its tokens go to the next assistant turn."""
        held, self._held = self._held, None
        if held is None:
            return
        for message in written:
            if held.message_id is None or message.id != held.message_id:
                continue
            if isinstance(message, RemoveMessage):
                self.recorded.update_partial(held.turn_index, ASSISTANT, "")
                self._vacant.add(held.turn_index)
                self._usage.add(*held.tokens)
                self._carried.extend(held.tool_calls or ())
                return
            if isinstance(message, AIMessage) and _text(message):
                held.text = _text(message)
        await self.recorded.complete_turn(
            held.turn_index, ASSISTANT, held.text, tool_calls=held.tool_calls,
            input_tokens=held.tokens[0], output_tokens=held.tokens[1], trace_attributes=self._trace_ids(),
        )

    def _take_calls(self) -> list[ToolCall] | None:
        """The tool calls an assistant turn gets: those carried from a removed message, then the pending ones."""
        calls, self._carried = [*self._carried, *self._calls.take()], []
        return calls or None

    async def _settle(self) -> None:
        """Complete the turns waiting: a preamble's and a held message's."""
        await self._finish_preamble()
        await self._settle_held()

    async def _tool_result(self, message: ToolMessage) -> None:
        self._calls.result(message.tool_call_id, message.content)
        preamble = self._preamble
        if preamble is not None:
            preamble.waiting.discard(message.tool_call_id)
            if not preamble.waiting:
                await self._finish_preamble()

    async def _finish_preamble(self) -> None:
        preamble, self._preamble = self._preamble, None
        if preamble is None:
            return
        input_tokens, output_tokens = preamble.tokens
        await self.recorded.complete_turn(
            preamble.turn_index, ASSISTANT, preamble.text, tool_calls=self._take_calls(),
            input_tokens=input_tokens, output_tokens=output_tokens, trace_attributes=self._trace_ids(),
        )


def _is_summary(message: BaseMessage) -> bool:
    """A summary LangChain's ``SummarizationMiddleware`` wrote (langchain 1.3.0 on marks it)."""
    return isinstance(message, HumanMessage) and message.additional_kwargs.get("lc_source") == _SUMMARY_SOURCE


def _context(turns: Iterable[StoredTurn], *, with_calls: bool = False) -> list[StoredTurn]:
    """The complete conversation turns a graph is given back: no summaries, none kept out of the LLM's
    context; with ``with_calls`` also an assistant turn with tool calls and no text."""
    return [t for t in conversation(turns, unfinished=False, with_calls=with_calls)
            if t.kind != TurnKind.SUMMARY and t.in_context]


def _tool_exchange(turn: StoredTurn, *, preamble: bool) -> list[BaseMessage]:
    """An assistant turn's stored tool calls as the graph held them: the ``AIMessage`` that made
    them (with ``preamble``, the turn's own text and id; else no text) and a ``ToolMessage`` with
    each one's result (:attr:`LangGraphMirror.history`)."""
    calls = [
        {"name": str(call.get("name", "")), "args": dict(call.get("arguments") or {}),
         "id": f"turnlog-{turn.turn_index}-{number}", "type": "tool_call"}
        for number, call in enumerate(turn.tool_calls or ())
    ]
    made: list[BaseMessage] = [
        AIMessage(content=turn.text, tool_calls=calls, id=f"turnlog-{turn.turn_index}") if preamble
        else AIMessage(content="", tool_calls=calls, id=f"turnlog-{turn.turn_index}-calls")
    ]
    for number, (call, stored) in enumerate(zip(calls, turn.tool_calls or (), strict=True)):
        result = stored.get("result")
        if not isinstance(result, str):
            result = "" if result is None else json.dumps(result, ensure_ascii=False)
        made.append(ToolMessage(content=result, tool_call_id=call["id"], name=call["name"],
                                id=f"turnlog-{turn.turn_index}-result-{number}"))
    return made


def _thread_id(config: Mapping[str, Any] | None) -> Any:
    """``config["configurable"]["thread_id"]``, or None."""
    configurable = config.get("configurable") if isinstance(config, Mapping) else None
    return configurable.get("thread_id") if isinstance(configurable, Mapping) else None


def _as_list(raw: Any) -> list[BaseMessage]:
    """A ``messages`` value (a message, a list of them, ``(role, text)`` tuples, dicts, a str) as messages."""
    if raw is None:
        return []
    batch: list[Any] = [raw] if isinstance(raw, (str, BaseMessage, Mapping)) else list(raw)
    return convert_to_messages(batch)


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(
        str(block.get("text") or "") for block in _blocks(content) if block.get("type") == "text"
    )


def _blocks(content: Iterable[Any]) -> list[Mapping[str, Any]]:
    return [
        block if isinstance(block, Mapping) else {"type": "text", "text": block}
        for block in content
        if isinstance(block, (Mapping, str))
    ]
