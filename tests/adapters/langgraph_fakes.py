"""A scripted chat model and a small LangGraph chat graph (with a tool step), no network.

:class:`ScriptedChat` answers with its ``replies`` in order (``AIMessage``
objects with ids, text or ``tool_calls``, and ``usage_metadata``). Streamed
(as LangGraph's ``"messages"`` mode makes it), it sends the text word by word
and the usage in a last, empty chunk; a reply whose id is in ``holds`` stops
after ``holds[id]`` words and waits forever (the crash test kills it there).
``seen`` keeps the messages of every call (what the model was shown).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt


def reply(id: str, text: str = "", *, input_tokens: int = 0, output_tokens: int = 0, tool_calls: list | None = None) -> AIMessage:
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}
    return AIMessage(content=text, id=id, usage_metadata=usage, tool_calls=tool_calls or [])


class ScriptedChat(BaseChatModel):
    replies: Iterator[AIMessage]
    holds: dict[str, int] = {}
    seen: list[list[BaseMessage]] = []

    @property
    def _llm_type(self) -> str:
        return "scripted-chat"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=next(self.replies))])

    async def _astream(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        self.seen.append(list(messages))
        message = next(self.replies)
        text = message.content if isinstance(message.content, str) else ""
        for i, word in enumerate(re.findall(r"\S+\s*", text)):
            if i == self.holds.get(message.id):
                await asyncio.Event().wait()  # until the process is killed
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word, id=message.id))
            if run_manager is not None:
                await run_manager.on_llm_new_token(word, chunk=chunk)
            yield chunk
        calls = [
            {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i, "type": "tool_call_chunk"}
            for i, c in enumerate(message.tool_calls)
        ]
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", id=message.id, usage_metadata=message.usage_metadata, tool_call_chunks=calls, chunk_position="last")
        )


def order_status(order: str) -> str:
    return f"order {order} ships tomorrow"


def chat_graph(
    model: ScriptedChat, checkpointer: Any, *, router: bool = False, wrap: bool = False, whole_list: bool = False
) -> Any:
    """START -> [router ->] chat -> (tools -> chat)* -> END over ``MessagesState``.

    ``router``: a node before ``chat`` that calls the model as a classifier and
    writes nothing (its answer picks no branch here; it is not part of the
    conversation). ``wrap``: ``chat`` writes a new ``AIMessage`` with the model's
    text, tool calls and usage (a new id) instead of the model's message.
    ``whole_list``: ``chat`` returns the whole message list with its message
    appended (``add_messages`` keeps what it already holds, by id).
    """

    async def classify(state: MessagesState) -> dict:
        await model.ainvoke(state["messages"])
        return {}

    async def chat(state: MessagesState) -> dict:
        out = await model.ainvoke(state["messages"])
        if wrap:
            out = AIMessage(content=out.content, tool_calls=out.tool_calls, usage_metadata=out.usage_metadata)
        return {"messages": [*state["messages"], out] if whole_list else [out]}

    def tools(state: MessagesState) -> dict:
        last = state["messages"][-1]
        return {"messages": [ToolMessage(content=order_status(**c["args"]), tool_call_id=c["id"]) for c in last.tool_calls]}

    def route(state: MessagesState) -> str:
        return "tools" if state["messages"][-1].tool_calls else END

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_node("tools", tools)
    if router:
        builder.add_node("router", classify)
        builder.add_edge(START, "router")
        builder.add_edge("router", "chat")
    else:
        builder.add_edge(START, "chat")
    builder.add_conditional_edges("chat", route, ["tools", END])
    builder.add_edge("tools", "chat")
    return builder.compile(checkpointer=checkpointer)


def review_graph(model: ScriptedChat, checkpointer: Any) -> Any:
    """START -> chat -> review -> END: LangGraph's review-and-edit pattern. ``review`` interrupts
    with the draft; resumed with a text (``Command(resume=text)``), it writes an ``AIMessage``
    with that text and the draft's id (``add_messages`` replaces the draft in place); resumed
    with anything else (``Command(resume={"approved": True})``), it writes nothing (the draft
    is approved as it is)."""

    async def chat(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def review(state: MessagesState) -> dict:
        draft = [m for m in state["messages"] if m.type == "ai"][-1]
        edited = interrupt({"draft": draft.content})
        return {"messages": [AIMessage(content=edited, id=draft.id)]} if isinstance(edited, str) else {}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_node("review", review)
    builder.add_edge(START, "chat")
    builder.add_edge("chat", "review")
    builder.add_edge("review", END)
    return builder.compile(checkpointer=checkpointer)


def clarify_graph(model: ScriptedChat, checkpointer: Any) -> Any:
    """START -> chat -> (ask -> chat)* -> END: an answer that ends with "?" goes to ``ask``,
    which interrupts for the human's reply; the caller resumes with
    ``Command(resume=..., update={"messages": [HumanMessage(reply)]})``, so the reply
    reaches the state through the command's update, not through a node."""

    async def chat(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def ask(state: MessagesState) -> dict:
        interrupt({"question": state["messages"][-1].content})
        return {}

    def route(state: MessagesState) -> str:
        return "ask" if str(state["messages"][-1].content).endswith("?") else END

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_node("ask", ask)
    builder.add_edge(START, "chat")
    builder.add_conditional_edges("chat", route, ["ask", END])
    builder.add_edge("ask", "chat")
    return builder.compile(checkpointer=checkpointer)
