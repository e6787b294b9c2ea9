"""An OpenAI Agents SDK agent for the crash test after a cut answer, run as its own
process: ``python -m tests.adapters.openai_agents_cut_script PHASE SESSION DB_PATH``.

The model is the SDK's ``OpenAIChatCompletionsModel`` on a fake client (every
item id is the SDK's ``FAKE_RESPONSES_ID``); the inner session is a ``SQLiteSession`` in the file
``DB_PATH``, which outlives a killed process. Progress goes to stdout as JSON
lines, flushed; settings come from the environment (``TURNLOG_*``).

- ``first``: question 0 streamed and cancelled after two words (a barged-in
  turn the inner session never holds); question 1 answered; question 2
  answered, and the inner session's save of answer 2 held once turnlog has it
  (recorded and acknowledged): it prints ``{"holding": true}`` and waits to be
  killed, so turnlog is one write ahead of the inner session.
- ``second``: opens the session again with the same file, prints the inner
  session's messages after the rebuild, asks question 3, ends the session and
  prints ``{"done": true, "rebuilt", "model_saw", "held"}`` (``held``: the
  inner session's messages at the end).
"""

from __future__ import annotations

import asyncio
import sys

from agents import Agent, OpenAIChatCompletionsModel, Runner, SQLiteSession, set_tracing_disabled

from turnlog.adapters.openai_agents import TurnlogSession
from turnlog.settings import TurnlogSettings

from tests.adapters.openai_agents_fakes import Reply, fake_chat_client
from tests.adapters.openai_agents_script import messages, say
from tests.adapters.stored import FLEET
from tests.support import recorder_for


class HeldSession(SQLiteSession):
    """A ``SQLiteSession`` whose saves of assistant items, once ``hold`` is set, announce
    themselves and never finish (the process is killed meanwhile)."""

    hold = False
    recorded: TurnlogSession | None = None

    async def add_items(self, items):  # noqa: ANN001
        if self.hold and any(item.get("role") == "assistant" for item in items):
            assert self.recorded is not None
            assert await self.recorded.recorded.wait_acknowledged(60), "answer 2 was not acknowledged"
            say(holding=True)
            await asyncio.Event().wait()
        await super().add_items(items)


async def first(session: TurnlogSession, inner: HeldSession) -> None:
    client = fake_chat_client([
        Reply(text="answer 0 is long and the user stops it", input_tokens=10, output_tokens=9, hold=2),
        Reply(text="answer 1", input_tokens=11, output_tokens=2),
        Reply(text="answer 2", input_tokens=12, output_tokens=2),
    ])
    agent = Agent(name="bot", model=OpenAIChatCompletionsModel("gpt-4o", openai_client=client))
    result = Runner.run_streamed(agent, "question 0", session=session, hooks=session.hooks)
    deltas = 0
    async for event in session.stream(result):
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            deltas += 1
            if deltas == 2:
                result.cancel()
    await Runner.run(agent, "question 1", session=session, hooks=session.hooks)
    inner.hold, inner.recorded = True, session
    await Runner.run(agent, "question 2", session=session, hooks=session.hooks)


async def second(session: TurnlogSession, inner: HeldSession) -> None:
    rebuilt = messages(await inner.get_items())
    client = fake_chat_client([Reply(text="answer 3", input_tokens=13, output_tokens=2)])
    model = OpenAIChatCompletionsModel("gpt-4o", openai_client=client)
    await Runner.run(Agent(name="bot", model=model), "question 3", session=session, hooks=session.hooks)
    await session.end("completed")
    model_saw = messages(client.chat.completions.calls[0])
    say(done=True, rebuilt=rebuilt, model_saw=model_saw, held=messages(await inner.get_items()))


async def main(phase: str, session_id: str, db_path: str) -> None:
    set_tracing_disabled(True)
    inner = HeldSession(session_id, db_path)
    async with recorder_for(TurnlogSettings()) as recorder:
        session = await TurnlogSession.open(recorder, inner, fleet=FLEET, agent_id="bot")
        await {"first": first, "second": second}[phase](session, inner)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
