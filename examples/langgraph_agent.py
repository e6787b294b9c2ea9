"""A LangGraph chat agent, mirrored into turnlog beside its own checkpointer.

Needs ``pip install 'turnlog[langgraph]' langchain-openai``, ``OPENAI_API_KEY``,
and turnlog's services running (``turnlog sequencer``, ``turnlog sink``;
``TURNLOG_*`` settings)::

    python examples/langgraph_agent.py thread-42

The checkpointer here is in memory: kill the process (``kill -9``) and start it
again with the same thread id, and the thread is rebuilt from turnlog.

The lines marked ``# turnlog`` are all the code turnlog needs (8 lines, 3 of
them imports); the rest is an ordinary LangGraph chat graph and loop.
"""

import asyncio
import sys

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

from turnlog import SessionRecorder, TurnlogSettings  # turnlog
from turnlog.adapters.langgraph import LangGraphMirror  # turnlog
from turnlog.resume_barrier import resume_source_for  # turnlog: the API with TURNLOG_API_URL, else the store


async def chat(state: MessagesState) -> dict:
    from langchain_openai import ChatOpenAI  # imported when the graph runs: the example imports without it

    return {"messages": [await ChatOpenAI(model="gpt-4o-mini").ainvoke(state["messages"])]}


graph = StateGraph(MessagesState).add_node("chat", chat).add_edge(START, "chat").compile(checkpointer=InMemorySaver())


async def main(thread_id: str) -> None:
    config = {"configurable": {"thread_id": thread_id}}
    settings = TurnlogSettings()  # turnlog
    async with SessionRecorder(settings, resume_source=resume_source_for(settings)) as recorder:  # turnlog
        mirror = await LangGraphMirror.open(recorder, thread_id, fleet="support", agent_id="bot-7")  # turnlog
        while (question := await asyncio.to_thread(input, "you> ")) != "bye":
            async for mode, chunk in mirror.astream(graph, {"messages": [("user", question)]}, config):  # turnlog
                if mode == "messages" and chunk[0].type == "AIMessageChunk":
                    print(chunk[0].content, end="", flush=True)
            print()
        await mirror.end("completed")  # turnlog


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "thread-42"))
