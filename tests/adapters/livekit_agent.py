"""A LiveKit agent for the crash test, run as its own process:
``python -m tests.adapters.livekit_agent PHASE SESSION``.

A real ``AgentSession`` (text-only, scripted LLM) recorded through
``turnlog.adapters.livekit``; settings come from the environment (``TURNLOG_*``).
Progress goes to stdout as JSON lines, flushed.

- ``first``: "Hello" and its reply (the model first calls the ``look_up_caller``
  tool, which LiveKit runs), then "Tell me a story", whose reply streams
  slowly (over a minute); prints ``speaking`` and waits to be SIGKILLed mid-reply.
- ``first-voice``: the same on the voice path (``SilentTTS``, audio played in real
  time behind LiveKit's ``TranscriptSynchronizer``): the story is generated at once
  and takes about two minutes to play.
- ``first-dropped``: "Hello" and its reply, then, through LiveKit's audio recognition
  (:class:`ScriptedUser`), the user says "never mind" (the agent's
  ``on_user_turn_completed`` stops it: LiveKit drops the turn) and starts "Tell me a
  story": prints ``speaking`` once "Tell me a" is heard, and waits to be SIGKILLed.
- ``resume``: the same session id again: prints what the resume rebuilt (the
  agent's ChatContext, its items with the tool call, and ``session.history``), asks "What happened next?",
  prints what the LLM was given, closes the session (it ends) and exits.
"""

from __future__ import annotations

import asyncio
import json
import sys

from livekit.agents import AgentSession, function_tool

from turnlog.adapters.livekit import record_session
from turnlog.resume_barrier import resume_source_for
from turnlog.settings import TurnlogSettings

from tests.adapters.livekit_fakes import (
    Gatekeeper,
    Reply,
    ScriptedLLM,
    ScriptedUser,
    SilentTTS,
    conversation_items,
    voice_outputs,
)
from tests.adapters.stored import FLEET

STORY = "Once upon a time, " + " ".join(f"dragon{i}" for i in range(800))
REPLIES = {
    "Hello": Reply("Hi! How can I help you today?", input_tokens=12, output_tokens=9, tool_call=("look_up_caller", "{}")),
    "Tell me a story": Reply(STORY, input_tokens=30, output_tokens=500, chunk_chars=5, chunk_seconds=0.05),
    "What happened next?": Reply("The dragon slept.", input_tokens=70, output_tokens=4),
}


#: The voice phase's replies: generated at once, far faster than they play.
FAST_REPLIES = {**REPLIES, "Tell me a story": Reply(STORY, input_tokens=30, output_tokens=500, chunk_chars=50)}


class StoryTeller(Gatekeeper):
    @function_tool
    async def look_up_caller(self) -> str:
        """Look up who is calling."""
        return "The caller is Ada."


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def messages(chat_ctx) -> list[tuple[str, str | None, bool]]:
    return [(m.role, m.text_content, m.interrupted) for m in chat_ctx.messages() if m.role in ("user", "assistant")]


async def main(phase: str, session_id: str) -> None:
    voice = phase == "first-voice"
    llm = ScriptedLLM(FAST_REPLIES if voice else REPLIES)
    user = ScriptedUser()
    if phase == "first-dropped":
        session: AgentSession = AgentSession(llm=llm, **user.session_options())
        user.attach(session)
    else:
        session = AgentSession(llm=llm, tts=SilentTTS() if voice else None, vad=None, user_away_timeout=None)
    if voice:
        voice_outputs(session)
    agent = StoryTeller(instructions="You tell stories.")
    recording = await record_session(session, agent, session_id=session_id, fleet=FLEET, agent_id="livekit-crash",
                                     resume_source=resume_source_for(TurnlogSettings()))
    say(
        resumed=recording.resumed,
        epoch=recording.recorded.epoch,
        chat_ctx=messages(agent.chat_ctx),
        history=messages(session.history),
        items=conversation_items(agent.chat_ctx.items),
    )
    await session.start(agent)
    if phase == "first-dropped":
        await session.run(user_input="Hello")
        while not user.listening:
            await asyncio.sleep(0.02)
        # "never mind": LiveKit ends the turn, and the agent's on_user_turn_completed stops it.
        user.starts_speaking()
        user.is_heard("never mind")
        user.stops_speaking()
        while recording.recorded.next_turn_index < 3 or recording.recorded.open_turns:  # until turn 2 is completed
            await asyncio.sleep(0.02)
        user.starts_speaking()
        user.is_heard("Tell me a", final=False)  # the test SIGKILLs us while the user speaks
        say(speaking=True)
        await asyncio.Event().wait()
    if phase in ("first", "first-voice"):
        await session.run(user_input="Hello")
        await recording.wait_recorded()
        story = session.run(user_input="Tell me a story")  # over a minute: the test SIGKILLs us first
        say(speaking=True)
        await story
        await asyncio.Event().wait()
    await session.run(user_input="What happened next?")
    await session.aclose()
    assert await recording.wait_closed(60), "the recording did not stop"
    say(done=True, llm_saw=[m for m in llm.contexts[-1] if m[0] in ("user", "assistant")], failures=recording.failures)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
