"""An OpenAI Agents SDK agent whose tool approval spans a process restart, run as its own
process: ``python -m tests.adapters.openai_agents_approval_script PHASE SESSION DIR VERDICT``.

The inner session is a ``SQLiteSession`` in ``DIR/inner.db`` and the run's state is
``RunState.to_string()`` in ``DIR/state.json``, both outliving a killed process. Progress goes
to stdout as JSON lines, flushed; settings come from the environment (``TURNLOG_*``).

- ``first``: asks for a refund; the model calls ``refund``, a ``needs_approval`` tool, so the
  run stops at the approval; the state is saved; it prints ``{"waiting": true}`` and waits to
  be killed.
- ``second``: opens the session again (a resume), loads the state with ``RunState.from_string``,
  approves the call (``VERDICT`` ``approve``) or rejects it (``reject``), runs it again, ends
  the session and prints ``{"done": true, "held", "model_saw"}`` (``held``: the inner session's
  items at the end, as :func:`items_of` gives them).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from agents import Agent, Runner, RunState, SQLiteSession, function_tool, set_tracing_disabled

from turnlog.adapters.openai_agents import TurnlogSession
from turnlog.settings import TurnlogSettings

from tests.adapters.openai_agents_fakes import FakeModel, Reply
from tests.adapters.openai_agents_script import say
from tests.adapters.stored import FLEET
from tests.support import recorder_for


@function_tool(needs_approval=True)
def refund(order: str) -> str:
    """Refund an order."""
    return f"order {order} refunded"


def items_of(items: list[Any]) -> list[list[Any]]:
    """The conversation's items in order: ``["user" | "assistant", text]`` for a message,
    ``["function_call", name, arguments]`` and ``["function_call_output", output]``."""
    out: list[list[Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call":
            out.append(["function_call", item["name"], json.loads(item["arguments"])])
        elif kind == "function_call_output":
            out.append(["function_call_output", item["output"]])
        elif kind == "message" and item.get("role") in ("user", "assistant"):
            content = item["content"]
            out.append([item["role"], content if isinstance(content, str) else "".join(p.get("text", "") for p in content)])
    return out


async def first(session: TurnlogSession, state_path: Path, verdict: str) -> None:
    model = FakeModel([Reply(call=("refund", '{"order": "42"}'), input_tokens=9, output_tokens=3)])
    agent = Agent(name="refunds", model=model, tools=[refund])
    result = await Runner.run(agent, "Refund order 42", session=session, hooks=session.hooks)
    assert [item.raw_item.call_id for item in result.interruptions] == ["call_1"]
    state_path.write_text(result.to_state().to_string())
    assert await session.recorded.wait_acknowledged(60), "the question was not acknowledged"
    say(waiting=True)
    await asyncio.Event().wait()


async def second(session: TurnlogSession, state_path: Path, verdict: str) -> None:
    text = "Order 42 is refunded." if verdict == "approve" else "I did not refund order 42."
    model = FakeModel([Reply(text=text, input_tokens=20, output_tokens=5)])
    agent = Agent(name="refunds", model=model, tools=[refund])
    state = await RunState.from_string(agent, state_path.read_text())
    for interruption in state.get_interruptions():
        (state.approve if verdict == "approve" else state.reject)(interruption)
    result = await Runner.run(agent, state, session=session, hooks=session.hooks)
    assert result.final_output == text
    await session.end("completed")
    say(done=True, held=items_of(await session.inner.get_items()), model_saw=items_of(model.calls[0]))


async def main(phase: str, session_id: str, folder: str, verdict: str) -> None:
    set_tracing_disabled(True)
    inner = SQLiteSession(session_id, str(Path(folder) / "inner.db"))
    async with recorder_for(TurnlogSettings()) as recorder:
        session = await TurnlogSession.open(recorder, inner, fleet=FLEET, agent_id="refunds")
        await {"first": first, "second": second}[phase](session, Path(folder) / "state.json", verdict)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
