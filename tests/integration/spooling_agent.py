"""A recorder process for the spool-erasure tests: ``python -m tests.integration.spooling_agent SESSION...``.

Settings come from the environment (``TURNLOG_*``; the tests point ``TURNLOG_BOOTSTRAP_SERVERS`` at
a closed port, so nothing leaves the spool). For each session it starts it and completes two turns
holding ``SECRET`` (each returns on the spool's fsync once the broker has not answered within
``TURNLOG_ACK_WAIT_SECONDS``), then opens a third turn and flushes its partial. Then it prints one
JSON line (the spool file and the events it holds) and waits to be killed.
"""

from __future__ import annotations

import asyncio
import json
import sys

from turnlog.producers import SessionRecorder
from turnlog.settings import TurnlogSettings

#: Said in every session; must never appear in clear in a spool file.
SECRET = "Kilimanjaro"
#: Events each session spools: started, two completed turns, one partial.
EVENTS_PER_SESSION = 4


async def main(session_ids: list[str]) -> None:
    recorder = await SessionRecorder(TurnlogSettings()).start()  # never closed: SIGKILL ends it
    for session_id in session_ids:
        session = await recorder.start_session(session_id, fleet="tests", agent_id="spooler")
        await session.complete_turn(0, "user", f"I climbed {SECRET} in {session_id}")
        await session.complete_turn(1, "agent", f"{SECRET} is high")
        session.update_partial(2, "user", f"and then {SECRET}")
        await session.flush_partial()
    sys.stdout.write(json.dumps({"spool": str(recorder.spool_path), "spooled": recorder.spooled_events()}) + "\n")
    sys.stdout.flush()
    await asyncio.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
