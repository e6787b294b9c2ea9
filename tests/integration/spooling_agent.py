"""A recorder process for the spool-erasure tests: ``python -m tests.integration.spooling_agent SESSION...``.

Settings come from the environment (``TURNLOG_*``; the tests point ``TURNLOG_BOOTSTRAP_SERVERS`` at
a closed port, so nothing leaves the spool). For each session id it starts fleet ``FLEET``'s session
and completes two turns holding ``SECRET`` (each returns on the spool's fsync once the broker has not
answered within ``TURNLOG_ACK_WAIT_SECONDS``), then opens a third turn and flushes its partial. Then
it prints one JSON line (the spool file, the events it holds and the sessions' keys, in the order of
their ids) and waits to be killed.
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
#: The fleet whose sessions the agent records.
FLEET = "tests"


async def main(session_ids: list[str]) -> None:
    recorder = await SessionRecorder(TurnlogSettings()).start()  # never closed: SIGKILL ends it
    keys = []
    for session_id in session_ids:
        session = await recorder.start_session(session_id, fleet=FLEET, agent_id="spooler")
        keys.append(session.session_id)
        await session.complete_turn(0, "user", f"I climbed {SECRET} in {session_id}")
        await session.complete_turn(1, "agent", f"{SECRET} is high")
        session.update_partial(2, "user", f"and then {SECRET}")
        await session.flush_partial()
    report = {"spool": str(recorder.spool_path), "spooled": recorder.spooled_events(), "sessions": keys}
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    await asyncio.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
