"""An OpenAI Agents SDK agent for the crash test, run as its own process:
``python -m tests.adapters.openai_agents_script PHASE SESSION``.

Settings come from the environment (``TURNLOG_*``); progress goes to stdout as
JSON lines, flushed. The inner session is an in-memory ``SQLiteSession``, so a
killed process loses it, as a container loses its local files.

- ``first``: asks questions 0 and 1 (answers 0 and 1; answer 1 after a call of the
  ``order_status`` tool), then question 2 streamed;
  the answer stops after its first four words, which are flushed and
  acknowledged; it prints ``{"streaming": true}`` and waits to be killed.
- ``second``: opens the session again (a resume), prints the inner session's
  rebuilt messages (``rebuilt``; ``rebuilt_items`` with the tool call and its
  output, :func:`conversation_items`), asks question 3, prints what the model
  was shown (``model_saw``, ``model_saw_items``), ends the session and prints
  ``{"done": true, ...}``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled

from turnlog.adapters.openai_agents import TurnlogSession
from turnlog.settings import TurnlogSettings

from tests.adapters.openai_agents_fakes import FakeModel, Reply
from tests.adapters.stored import FLEET
from tests.support import recorder_for


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


@function_tool
def order_status(order: str) -> str:
    """The shipping status of an order."""
    return f"order {order} ships tomorrow"


def conversation_items(items: list) -> list[list[object]]:
    """The messages as :func:`messages` gives them, with each ``function_call`` as
    ``["function_call", name, arguments]`` and each output as ``["function_call_output", output]``."""
    out: list[list[object]] = []
    for item in items:
        if item.get("type") == "function_call":
            out.append(["function_call", item["name"], json.loads(item["arguments"])])
        elif item.get("type") == "function_call_output":
            out.append(["function_call_output", item["output"]])
        else:
            out.extend([list(message) for message in messages([item])])
    return out


def messages(items: list) -> list[tuple[str, str]]:
    out = []
    for item in items:
        if item.get("type", "message") == "message" and item.get("role") in ("user", "assistant"):
            content = item["content"]
            out.append((item["role"], content if isinstance(content, str) else "".join(p.get("text", "") for p in content)))
    return out


async def first(session: TurnlogSession) -> None:
    model = FakeModel([
        Reply(text="answer 0", input_tokens=10, output_tokens=2),
        Reply(call=("order_status", '{"order": "1"}')),
        Reply(text="answer 1", input_tokens=11, output_tokens=2),
        Reply(text="answer 2 is on its way to you", input_tokens=12, output_tokens=8, hold=4),
    ])
    agent = Agent(name="bot", model=model, tools=[order_status])
    for n in range(2):
        await Runner.run(agent, f"question {n}", session=session, hooks=session.hooks)
        say(completed=n)
    result = Runner.run_streamed(agent, "question 2", session=session, hooks=session.hooks)
    deltas = 0
    async for event in session.stream(result):
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            deltas += 1
            if deltas == 4:
                await session.recorded.flush_partial()
                assert await session.recorded.wait_acknowledged(60), "the partial was not acknowledged"
                say(streaming=True)


async def second(session: TurnlogSession) -> None:
    held = await session.inner.get_items()
    model = FakeModel([Reply(text="answer 3", input_tokens=13, output_tokens=2)])
    await Runner.run(Agent(name="bot", model=model, tools=[order_status]), "question 3", session=session, hooks=session.hooks)
    await session.end("completed")
    say(done=True, rebuilt=messages(held), rebuilt_items=conversation_items(held), model_saw=messages(model.calls[0]),
        model_saw_items=conversation_items(model.calls[0]), epoch=session.recorded.epoch)


async def main(phase: str, session_id: str) -> None:
    set_tracing_disabled(True)
    async with recorder_for(TurnlogSettings()) as recorder:
        session = await TurnlogSession.open(recorder, SQLiteSession(session_id), fleet=FLEET, agent_id="bot")
        await {"first": first, "second": second}[phase](session)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
