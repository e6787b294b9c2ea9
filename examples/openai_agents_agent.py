"""A chat agent on the OpenAI Agents SDK whose conversation turnlog makes crash-safe.

Needs ``pip install 'turnlog[openai-agents]'``, ``OPENAI_API_KEY``, and turnlog's
services running (``turnlog sequencer``, ``turnlog sink``; ``TURNLOG_*`` settings)::

    python examples/openai_agents_agent.py call-42

Kill it (``kill -9``) mid-conversation and start it again with the same id: the
session resumes in turnlog, the inner session (in memory here, so lost) is
rebuilt from turnlog, and the agent remembers what was said.

The lines marked ``# turnlog`` are all the code turnlog needs (7 lines, 2 of
them imports); the rest is an ordinary Agents SDK chat loop.
"""

import asyncio
import sys

from agents import Agent, Runner, SQLiteSession

from turnlog import SessionRecorder, TurnlogSettings  # turnlog
from turnlog.adapters.openai_agents import TurnlogSession  # turnlog

agent = Agent(name="support", instructions="You help customers with their orders. Be brief.")


async def main(session_id: str) -> None:
    async with SessionRecorder(TurnlogSettings()) as recorder:  # turnlog
        session = await TurnlogSession.open(recorder, SQLiteSession(session_id), fleet="support", agent_id="bot-7")  # turnlog
        while (question := await asyncio.to_thread(input, "you> ")) != "bye":
            result = Runner.run_streamed(agent, question, session=session, hooks=session.hooks)  # turnlog
            async for event in session.stream(result):  # turnlog: records the answer's partial text as it streams
                if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                    print(event.data.delta, end="", flush=True)
            print()
        await session.end("completed")  # turnlog


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "call-42"))
