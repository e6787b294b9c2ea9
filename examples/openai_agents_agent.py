"""A chat agent on the OpenAI Agents SDK whose conversation turnlog makes crash-safe.

Needs ``pip install 'turnlog[openai-agents]'``, ``OPENAI_API_KEY``, and turnlog's
services running (``turnlog sequencer``, ``turnlog sink``; ``TURNLOG_*`` settings)::

    python examples/openai_agents_agent.py call-42

Kill it (``kill -9``) mid-conversation and start it again with the same id: the
session resumes in turnlog, the inner session (in memory here, so lost) is
rebuilt from turnlog, and the agent remembers what was said.

The lines marked ``# turnlog`` are all the code turnlog needs (9 lines, 3 of
them imports); the rest is an ordinary Agents SDK chat loop.
"""

import asyncio
import sys

from agents import Agent, Runner, SQLiteSession

from turnlog import SessionRecorder, TurnlogSettings  # turnlog
from turnlog.adapters.openai_agents import TurnlogSession  # turnlog
from turnlog.resume_barrier import resume_source_for  # turnlog: the API with TURNLOG_API_URL, else the store

agent = Agent(name="support", instructions="You help customers with their orders. Be brief.")


async def main(session_id: str) -> None:
    settings = TurnlogSettings()  # turnlog
    async with SessionRecorder(settings, resume_source=resume_source_for(settings)) as recorder:  # turnlog
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
