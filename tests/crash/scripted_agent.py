"""A small agent for crash tests, run as its own process: ``python -m tests.crash.scripted_agent SCENARIO SESSION``.

The session is fleet ``FLEET``'s ``SESSION``, keyed ``session_key(FLEET, SESSION)``.

Settings come from the environment (``TURNLOG_*``). Progress goes to stdout as
JSON lines, flushed, so a test can SIGKILL the process at a known point.

- ``talk``: completes turn after turn ("turn N", speaker A/B), forever.
- ``overlap``: turn 0 complete; agent turn 1 and user turn 2 open at once; the
  user barges in, so turn 1 is completed ``barged_in`` with the words spoken;
  agent turn 3 opens while turn 2 is still open; both partials are spooled and
  acknowledged; then it waits to be killed with turns 2 and 3 open.
- ``hold``: records nothing; its recorder adopts the orphaned spools of the
  folder at start and holds them (delivering when it can) until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys

from turnlog.producers import SessionRecorder
from turnlog.schemas.session_keys import session_key
from turnlog.settings import TurnlogSettings

FLEET = "tests"


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def talk(recorder: SessionRecorder, session_id: str) -> None:
    session = await recorder.start_session(session_id, fleet=FLEET, agent_id="talker")
    index = 0
    while True:
        session.update_partial(index, "AB"[index % 2], f"turn {index} so")
        await session.complete_turn(index, "AB"[index % 2], f"turn {index} said in full", input_tokens=index, output_tokens=1)
        say(completed=index, degraded=recorder.degraded, spooled=recorder.spooled_events())
        index += 1
        await asyncio.sleep(0.2)  # the agent's pace (a turn every 200 ms until it is killed), not a sync


async def overlap(recorder: SessionRecorder, session_id: str) -> None:
    session = await recorder.start_session(session_id, fleet=FLEET, agent_id="overlap")
    await session.complete_turn(0, "user", "hello there")
    session.update_partial(1, "agent", "Let me tell you about")
    session.update_partial(2, "user", "wait")
    session.update_partial(1, "agent", "Let me tell you about our")
    await session.complete_turn(1, "agent", "Let me tell you about our", barged_in=True, output_tokens=6)
    session.update_partial(2, "user", "wait, what about")
    session.update_partial(3, "agent", "Of course,")
    await session.flush_partial()
    assert await session.wait_acknowledged(60), "partials not acknowledged"
    say(ready=True, open_turns=list(session.open_turns))
    await asyncio.Event().wait()  # until SIGKILL


async def hold(recorder: SessionRecorder, session_id: str) -> None:
    say(holding=recorder.spooled_events(session_key(FLEET, session_id)), spool=str(recorder.spool_path))
    await asyncio.Event().wait()  # until SIGKILL


async def main(scenario: str, session_id: str) -> None:
    async with SessionRecorder(TurnlogSettings()) as recorder:
        await {"talk": talk, "overlap": overlap, "hold": hold}[scenario](recorder, session_id)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
