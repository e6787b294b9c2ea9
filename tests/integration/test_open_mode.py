"""Open mode (TURNLOG_INSECURE_OPEN_FLEETS, no fleet keys) on the real broker, Postgres, sequencer
and sink: two fleets that use one session id honestly are refused, never merged (docs/design.md,
"Write-side isolation")."""

from __future__ import annotations

import uuid

from turnlog.dlq import REASON_HEADER, reason_class
from turnlog.producers import partition_for

from tests.integration.test_pipeline import finalized, stored_turns
from tests.support import partition_records, recorder_for, wait_until

TIMEOUT = 90


async def test_a_second_fleet_s_session_with_the_same_id_is_refused_and_the_first_is_kept_whole(pipeline):
    assert pipeline.settings.insecure_open_fleets and not pipeline.settings.fleet_keys
    session_id = f"room-{uuid.uuid4().hex[:8]}"
    async with recorder_for(pipeline.settings) as first:
        mine = await first.start_session(session_id, fleet="fleet-a", agent_id="a")
        await mine.complete_turn(0, "user", "fleet a speaks")
        async with recorder_for(pipeline.settings) as second:  # another fleet's agent, the same room name
            theirs = await second.start_session(session_id, fleet="fleet-b", agent_id="b")
            await theirs.complete_turn(0, "user", "fleet b speaks")
            await theirs.complete_turn(1, "user", "and again")
        await mine.complete_turn(1, "agent", "fleet a answers")
        await mine.end("completed")
    wait_until(lambda: finalized(pipeline, session_id), timeout=TIMEOUT, what="fleet a's session finalized")
    assert [t.text for t in stored_turns(pipeline, session_id)] == ["fleet a speaks", "fleet a answers"]

    partition = partition_for(session_id, pipeline.settings.partitions)

    def refused() -> list[str]:
        records = partition_records(pipeline.settings.bootstrap_servers, pipeline.settings.topics.dlq, partition)
        return [reason_class(dict(headers)[REASON_HEADER].decode()) for key, _, headers in records
                if key == session_id.encode()]

    wait_until(lambda: len(refused()) == 3, timeout=TIMEOUT, what="fleet b's three records in the DLQ")
    assert refused() == ["foreign fleet"] * 3
