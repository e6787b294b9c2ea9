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

**What it records.** :meth:`LangGraphMirror.astream` runs
``graph.astream(input, config, stream_mode=["messages", "updates", ...])``
and yields every ``(mode, chunk)`` pair unchanged:

- each ``HumanMessage`` of the input's ``messages`` is a completed ``user``
  turn, recorded before the graph runs;
- ``"messages"`` mode: each ``AIMessageChunk`` adds its text to the open
  ``assistant`` turn of its message id (the whole text so far, flushed by the
  recorder's timer); ``partial_nodes`` restricts this to some nodes
  (``metadata["langgraph_node"]``), e.g. to leave out a router's model call;
- ``"updates"`` mode: each ``AIMessage`` with text that a node writes to the
  ``messages`` key is a completed ``assistant`` turn (at the index of its
  streamed partial, matched by message id), with tokens from
  ``usage_metadata`` (``input_tokens``, ``output_tokens``); a ``HumanMessage``
  a node writes is a completed ``user`` turn. An ``AIMessage`` that only
  calls tools is not a turn: its ``tool_calls`` (with the ``ToolMessage``
  contents as results) and its tokens go to the next assistant turn. A
  message id already recorded is not recorded again (a node that returns the
  whole list).
- a streamed message that no update completes is completed when the stream
  ends: as is if the graph finished, ``barged_in=True`` if the stream was cut
  short (the caller stopped iterating, a cancellation, an exception): the
  words the user saw. A caller that stops iterating early closes the
  stream (``async with contextlib.aclosing(mirror.astream(...))``), so this
  happens at once rather than when the generator is garbage-collected.

Text is the message's ``content`` string, or the concatenated ``text`` of
its ``{"type": "text"}`` blocks. ``subgraphs=True`` and ``version="v2"`` are
refused (the stream's shape changes). System messages are not recorded.

**Resume.** :meth:`LangGraphMirror.open` resumes the session (thread) if
turnlog has it (``SessionRecorder.resume``: the resume barrier, a new epoch)
and starts it otherwise; :attr:`LangGraphMirror.history` holds the stored
complete turns as ``HumanMessage``/``AIMessage`` objects. On the first
:meth:`LangGraphMirror.astream` after a resume, if the graph has a
checkpointer and the thread's state holds no messages (the checkpointer lost
it: an in-memory saver, a new database), the history is put in front of the
input's messages, so the graph continues the conversation; they are not
recorded again. If the state holds messages past turnlog's last complete
turn (the process was killed after the checkpointer saved a message but
before its update reached turnlog), they are recorded first. A state that
differs from turnlog is left alone, with a warning. A graph without a
checkpointer gets ``history`` from the caller.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.messages.utils import convert_to_messages

from turnlog.producers import RecordedSession, SessionNotFoundError, SessionRecorder
from turnlog.schemas import ToolCall, TurnStatus

__all__ = ["LangGraphMirror", "USER", "ASSISTANT"]

logger = logging.getLogger(__name__)

#: Speakers of the recorded turns.
USER = "user"
ASSISTANT = "assistant"
_MODES = ("messages", "updates")


@dataclass(slots=True)
class _Streamed:
    turn_index: int
    text: str = ""


class LangGraphMirror:
    """Records one LangGraph thread's conversation in turnlog. Make it with :meth:`open`.

    ``recorded`` is the turnlog session; ``messages_key`` is the state key of
    the conversation (``"messages"``, as in ``MessagesState``).
    """

    def __init__(
        self, recorded: RecordedSession, *, messages_key: str = "messages", partial_nodes: Collection[str] | None = None
    ) -> None:
        self.recorded = recorded
        self.messages_key = messages_key
        self.partial_nodes = None if partial_nodes is None else frozenset(partial_nodes)
        self._streamed: dict[str, _Streamed] = {}  # message id -> open assistant turn
        self._seen: set[str] = set()  # message ids recorded (or rebuilt from turnlog)
        self._tool_calls: dict[str, dict[str, Any]] = {}  # tool call id -> {"name", "arguments", "result"}
        self._tokens = [0, 0]  # input, output tokens of tool-calling messages, for the next assistant turn
        self._resumed = recorded.epoch > 0  # the first astream compares turnlog with the checkpointer

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
        """Resume ``thread_id`` in turnlog if turnlog has it, else start it (the turnlog session id is the thread id).

        Raises:
            SessionClosedError: turnlog has the session and it has ended.
            ResumeBarrierTimeout, SpoolError, InvalidTurnError: as
                ``SessionRecorder.resume`` and ``start_session``.
        """
        try:
            recorded = await recorder.resume(thread_id)
        except SessionNotFoundError:
            recorded = await recorder.start_session(thread_id, fleet=fleet, agent_id=agent_id, metadata=metadata)
        return cls(recorded, messages_key=messages_key, partial_nodes=partial_nodes)

    @property
    def history(self) -> list[BaseMessage]:
        """The complete turns turnlog held at the resume, as ``HumanMessage`` (user) and
        ``AIMessage`` (assistant) objects with ids ``turnlog-<turn_index>``; other speakers are left out."""
        kinds = {USER: HumanMessage, ASSISTANT: AIMessage}
        return [
            kinds[t.speaker](content=t.text, id=f"turnlog-{t.turn_index}")
            for t in self.recorded.turns
            if t.status == TurnStatus.COMPLETE and t.speaker in kinds
        ]

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
        a ``Command``/None (nothing recorded from it). ``kwargs`` go to ``graph.astream``.

        Raises:
            ValueError: ``subgraphs=True`` or ``version="v2"`` (another stream shape).
            RecorderError: turnlog refused a turn; what the graph raises.
        """
        if kwargs.get("subgraphs") or kwargs.get("version", "v1") != "v1":
            raise ValueError(
                "LangGraphMirror reads the v1 stream without subgraphs: no subgraphs=True, no version='v2'"
            )
        input = await self._with_history(graph, input, config)
        new = self._input_messages(input)
        for message in new:
            await self._complete(message)
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
            for message_id, streamed in list(self._streamed.items()):
                del self._streamed[message_id]
                self._seen.add(message_id)
                await self.recorded.complete_turn(streamed.turn_index, ASSISTANT, streamed.text, barged_in=not finished)

    async def end(self, reason: str = "completed") -> None:
        """End the turnlog session (the graph's thread is left as it is). Raises as ``RecordedSession.end``."""
        await self.recorded.end(reason)

    # -- internals -----------------------------------------------------------
    async def _with_history(self, graph: Any, input: Any, config: Mapping[str, Any] | None) -> Any:
        """On the first call after a resume, with a checkpointer: ``input`` with the
        rebuilt history in front of its messages if the thread's state holds no
        messages; else ``input``, after recording the messages the checkpointer
        holds past turnlog's last turn (a kill between the two)."""
        if not self._resumed:
            return input
        self._resumed = False
        history = self.history
        self._seen.update(m.id for m in history if m.id)
        if getattr(graph, "checkpointer", None) is None:
            return input
        state = await graph.aget_state(config)
        held = (state.values or {}).get(self.messages_key) or []
        if held:
            await self._catch_up(held)
            return input
        if not history or not isinstance(input, Mapping):
            return input
        logger.info("thread %s: the checkpointer holds no messages; %d rebuilt from turnlog", self.recorded.session_id,
                    len(history))
        return {**input, self.messages_key: [*history, *convert_to_messages(input.get(self.messages_key) or [])]}

    async def _catch_up(self, held: Sequence[BaseMessage]) -> None:
        """Record the conversation messages of ``held`` (the checkpointer's) after the
        latest run of them equal to turnlog's complete turns; none if they differ."""
        said = [m for m in held if isinstance(m, (HumanMessage, AIMessage)) and _text(m)]
        pairs = [(USER if isinstance(m, HumanMessage) else ASSISTANT, _text(m)) for m in said]
        stored = [
            (t.speaker, t.text)
            for t in self.recorded.turns
            if t.status == TurnStatus.COMPLETE and t.speaker in (USER, ASSISTANT)
        ]
        start = _after_run(stored, pairs)
        if start is None:
            logger.warning(
                "thread %s: the checkpointer's %d messages differ from turnlog's %d turns; none recorded from it",
                self.recorded.session_id, len(pairs), len(stored),
            )
            return
        self._seen.update(m.id for m in said[:start] if m.id)
        if start < len(said):
            logger.info("thread %s: %d messages of the checkpointer were not in turnlog; recorded",
                        self.recorded.session_id, len(said) - start)
        for message in said[start:]:
            await self._complete(message)

    def _input_messages(self, input: Any) -> list[BaseMessage]:
        if not isinstance(input, Mapping):
            return []
        raw = input.get(self.messages_key) or []
        batch: list[Any] = [raw] if isinstance(raw, (str, BaseMessage, Mapping)) else raw  # whatever the state holds
        messages = convert_to_messages(batch)
        return [m for m in messages if isinstance(m, HumanMessage) and not (m.id and m.id in self._seen)]

    def _on_chunk(self, message: Any, metadata: Mapping[str, Any]) -> None:
        if not isinstance(message, AIMessageChunk) or not message.id or message.id in self._seen:
            return
        if self.partial_nodes is not None and metadata.get("langgraph_node") not in self.partial_nodes:
            return
        text = _text(message)
        if not text:
            return
        streamed = self._streamed.get(message.id)
        if streamed is None:
            streamed = self._streamed[message.id] = _Streamed(self.recorded.next_turn_index)
        streamed.text += text
        self.recorded.update_partial(streamed.turn_index, ASSISTANT, streamed.text)

    async def _on_update(self, update: Any) -> None:
        if not isinstance(update, Mapping):
            return
        for written in update.values():  # {node: its write}; a write may be None or a list of writes
            for write in written if isinstance(written, list) else [written]:
                if not isinstance(write, Mapping):
                    continue
                raw = write.get(self.messages_key)
                if raw is None:
                    continue
                batch: list[Any] = [raw] if isinstance(raw, (BaseMessage, Mapping)) else raw
                for message in convert_to_messages(batch):
                    await self._complete(message)

    async def _complete(self, message: BaseMessage) -> None:
        if message.id:
            if message.id in self._seen:
                return
            self._seen.add(message.id)
        if isinstance(message, ToolMessage):
            call = self._tool_calls.get(message.tool_call_id)
            if call is not None:
                call["result"] = message.content
            return
        if isinstance(message, HumanMessage):
            speaker = USER
        elif isinstance(message, AIMessage):
            speaker = ASSISTANT
        else:
            return
        text = _text(message)
        input_tokens = output_tokens = 0
        calls: tuple[ToolCall, ...] = ()
        if isinstance(message, AIMessage):  # speaker == ASSISTANT
            usage: Mapping[str, Any] = message.usage_metadata or {}
            self._tokens[0] += int(usage.get("input_tokens") or 0)
            self._tokens[1] += int(usage.get("output_tokens") or 0)
            for tool_call in message.tool_calls:
                self._tool_calls[str(tool_call.get("id"))] = {"name": tool_call["name"],
                                                              "arguments": dict(tool_call.get("args") or {})}
            if not text:
                return  # a tool-calling message: its calls and tokens go with the next assistant turn
            input_tokens, output_tokens = self._tokens
            self._tokens = [0, 0]
            calls = tuple(
                ToolCall(name=c["name"], arguments=c["arguments"], result=c.get("result"))
                for c in self._tool_calls.values()
            )
            self._tool_calls.clear()
        streamed = self._streamed.pop(message.id, None) if message.id else None
        index = streamed.turn_index if streamed is not None else self.recorded.next_turn_index
        await self.recorded.complete_turn(
            index, speaker, text, tool_calls=calls or None, input_tokens=input_tokens, output_tokens=output_tokens
        )


def _after_run(run: list[tuple[str, str]], items: list[tuple[str, str]]) -> int | None:
    """The position in ``items`` after its latest stretch that ends like ``run``
    (the whole of ``run``, or its tail when ``items`` starts later: a trimmed
    state); 0 if ``run`` is empty; None if there is no such stretch."""
    if not run:
        return 0
    for end in range(len(items), 0, -1):
        n = min(end, len(run))
        if items[end - n : end] == run[len(run) - n :]:
            return end
    return None


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
