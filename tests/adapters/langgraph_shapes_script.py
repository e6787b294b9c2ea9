"""A LangGraph agent whose graph has every shape the mirror must record once, for the
crash test, run as its own process: ``python -m tests.adapters.langgraph_shapes_script PHASE THREAD``.

The graph (``chat_graph(..., router=True, wrap=True, whole_list=True)``): a
router node whose model call is not part of the conversation, a chat node
that wraps the model's output in a new ``AIMessage`` and returns the whole
message list, and a tool step. Settings come from the environment
(``TURNLOG_*``); progress goes to stdout as JSON lines, flushed. The
checkpointer is an ``InMemorySaver``, so a killed process loses the thread.

- ``first``: question 0 (a preamble with a tool call, then the answer), then
  question 1, whose answer stops after four streamed words, flushed and
  acknowledged; prints ``{"streaming": true}`` and waits to be killed.
- ``second``: opens the thread again (a resume), asks question 2 on a new,
  empty checkpointer, ends the session, and prints what the chat node's model
  was shown and the conversation the graph holds at the end.
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

CALL = {"name": "order_status", "args": {"order": "42"}, "id": "call-1", "type": "tool_call"}


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def graph_of(model: ScriptedChat) -> object:
    return chat_graph(model, InMemorySaver(), router=True, wrap=True, whole_list=True)


async def first(mirror: LangGraphMirror, config: dict) -> None:
    model = ScriptedChat(replies=iter([
        reply("route-0", "orders"),
        reply("ai-0", "Let me check.", tool_calls=[CALL], input_tokens=10, output_tokens=4),
        reply("ai-1", "Order 42 ships tomorrow.", input_tokens=20, output_tokens=5),
        reply("route-1", "chat"),
        reply("ai-2", "answer 1 is on its way to you", input_tokens=30, output_tokens=8),
    ]), holds={"ai-2": 4}, seen=[])
    graph = graph_of(model)
    for n in range(2):
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
    model = ScriptedChat(replies=iter([reply("route-2", "chat"), reply("ai-3", "answer 2", input_tokens=13, output_tokens=2)]), seen=[])
    graph = graph_of(model)
    async for _ in mirror.astream(graph, {"messages": [("user", "question 2")]}, config):
        pass
    await mirror.end("completed")
    state = await graph.aget_state(config)  # type: ignore[attr-defined]
    say(
        done=True,
        epoch=mirror.recorded.epoch,
        model_saw=[[m.type, m.content] for m in model.seen[1]],  # the chat node's call (seen[0]: the router's)
        graph_holds=[[m.type, m.content] for m in state.values["messages"]],
    )


async def main(phase: str, thread: str) -> None:
    async with recorder_for(TurnlogSettings()) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot")
        await {"first": first, "second": second}[phase](mirror, {"configurable": {"thread_id": thread}})


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
