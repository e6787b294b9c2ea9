"""A LiveKit voice agent whose conversation turnlog records as it happens.

    pip install 'turnlog[livekit]'
    export TURNLOG_BOOTSTRAP_SERVERS=...  TURNLOG_API_URL=... TURNLOG_API_TOKEN=...   # or TURNLOG_DATABASE_URL
    export LIVEKIT_URL=... LIVEKIT_API_KEY=... LIVEKIT_API_SECRET=...
    python examples/livekit_agent.py dev

Every turn is written ahead to Kafka while it is spoken, so a killed job
loses at most the last flush interval of the turn in progress. When LiveKit
dispatches the room again after a crash, the new job resumes the session
and the agent continues with the conversation rebuilt from turnlog.
Importing this file needs no network. The lines marked ``# turnlog`` are all
the code turnlog needs (5 lines); the whole agent is 14 lines of code. Your
agent's code goes in ``entrypoint``: models, instructions, tools.
"""

from livekit.agents import Agent, AgentServer, AgentSession, JobContext, cli

from turnlog import TurnlogSettings  # turnlog
from turnlog.adapters.livekit import record_session  # turnlog
from turnlog.resume_barrier import resume_source_for  # turnlog: the API with TURNLOG_API_URL, else the store

server = AgentServer()


@server.rtc_session()
async def entrypoint(ctx: JobContext) -> None:
    # Your agent: models, instructions, tools. The strings are LiveKit Inference models.
    session = AgentSession(stt="deepgram/nova-3", llm="openai/gpt-4.1-mini", tts="cartesia/sonic-2")
    agent = Agent(instructions="You are a friendly voice assistant.")
    # One turnlog id per conversation: here the room (one room per call).
    await record_session(session, agent, session_id=ctx.room.name, fleet="support", agent_id="assistant",  # turnlog
                         resume_source=resume_source_for(TurnlogSettings()))  # turnlog
    await session.start(agent, room=ctx.room)


if __name__ == "__main__":
    cli.run_app(server)
