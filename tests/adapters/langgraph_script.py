"""A LangGraph agent for the crash test, run as its own process:
``python -m tests.adapters.langgraph_script PHASE THREAD``.

Settings come from the environment (``TURNLOG_*``); progress goes to stdout as
JSON lines, flushed. The checkpointer is an ``InMemorySaver``, so a killed
process loses the thread, as a container loses its local state.

- ``first``: questions 0 and 1 (answers 0 and 1; answer 1 after a call of the
  ``order_status`` tool), then question 2, whose answer
  stops after four streamed words, flushed and acknowledged; prints
  ``{"streaming": true}`` and waits to be killed.
- ``second``: opens the thread again (a resume), asks question 3 on a new,
  empty checkpointer, ends the session, and prints what the model was shown:
  ``model_saw`` (the messages with text) and ``model_saw_items`` (every message,
  the tool call and its result included).
"""

from __future__ import annotations

import asyncio
import json
import sys

from langchain_core.messages import AIMessageChunk
from langgraph.checkpoint.memory import InMemorySaver

from turnlog.adapters.langgraph import LangGraphMirror
from turnlog.settings import TurnlogSettings

from tests.adapters.langgraph_fakes import ScriptedChat, chat_graph, reply
from tests.adapters.stored import FLEET
from tests.support import recorder_for


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def first(mirror: LangGraphMirror, config: dict) -> None:
    model = ScriptedChat(replies=iter([
        reply("ai-0", "answer 0", input_tokens=10, output_tokens=2),
        reply("ai-1-call", tool_calls=[{"name": "order_status", "args": {"order": "1"}, "id": "call-1",
                                        "type": "tool_call"}]),
        reply("ai-1", "answer 1", input_tokens=11, output_tokens=2),
        reply("ai-2", "answer 2 is on its way to you", input_tokens=12, output_tokens=8),
    ]), holds={"ai-2": 4}, seen=[])
    graph = chat_graph(model, InMemorySaver())
    for n in range(3):
        words = 0
        async for mode, chunk in mirror.astream(graph, {"messages": [("user", f"question {n}")]}, config):
            if mode == "messages" and isinstance(chunk[0], AIMessageChunk) and chunk[0].id == "ai-2" and chunk[0].content:
                words += 1
                if words == 4:
                    await mirror.recorded.flush_partial()
                    assert await mirror.recorded.wait_acknowledged(60), "the partial was not acknowledged"
                    say(streaming=True)
        say(completed=n)


async def second(mirror: LangGraphMirror, config: dict) -> None:
    model = ScriptedChat(replies=iter([reply("ai-3", "answer 3", input_tokens=13, output_tokens=2)]), seen=[])
    async for _ in mirror.astream(chat_graph(model, InMemorySaver()), {"messages": [("user", "question 3")]}, config):
        pass
    await mirror.end("completed")
    seen = model.seen[0]
    say(done=True, model_saw=[[m.type, m.content] for m in seen if m.type in ("human", "ai") and m.content],
        model_saw_items=items(seen),
        epoch=mirror.recorded.epoch)


def items(messages: list) -> list[list]:
    """``messages`` as ``[type, text]``, a tool call as ``["tool_call", name, args]`` and its result as
    ``["tool_result", content]``: what the model was shown, calls included, ids left out."""
    shown: list[list] = []
    for message in messages:
        shown += [["tool_call", call["name"], call["args"]] for call in getattr(message, "tool_calls", None) or ()]
        if message.type == "tool":
            shown.append(["tool_result", message.content])
        elif message.content:
            shown.append([message.type, message.content])
    return shown


async def main(phase: str, thread: str) -> None:
    async with recorder_for(TurnlogSettings()) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot")
        await {"first": first, "second": second}[phase](mirror, {"configurable": {"thread_id": thread}})


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
