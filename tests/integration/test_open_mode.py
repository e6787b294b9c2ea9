"""Open mode (TURNLOG_INSECURE_OPEN_FLEETS, no fleet keys) on the real broker, Postgres, sequencer
and sink: two fleets that use one session id honestly write two sessions (their keys differ), and
a record of a session that claims another fleet than the session's is refused, never merged
(docs/design.md, "Session keys" and "Write-side isolation")."""

from __future__ import annotations

import uuid

import msgspec
import pytest
from confluent_kafka import Producer

from turnlog.deploy.processes import stop_all
from turnlog.dlq import REASON_HEADER, reason_class
from turnlog.producers import partition_for
from turnlog.schemas import encode_event
from turnlog.signing import claim_headers

from tests.integration.conftest import drop_topics, make_pipeline
from tests.integration.test_pipeline import finalized, stored_turns
from tests.support import EventFactory, partition_records, recorder_for, wait_until

TIMEOUT = 90


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap, postgres_databases, tmp_path_factory):
    """The sequencer and the sink, run open: no fleet keys, ``insecure_open_fleets``."""
    running = make_pipeline(kafka_bootstrap, postgres_databases.create(), tmp_path_factory.mktemp("open"),
                            ("sequencer", "sink"), insecure_open_fleets=True)
    yield running
    stop_all(running.processes)
    running.store.engine.dispose()
    drop_topics(running.settings)


def write_claiming(pipeline, session_id: str, fleet: str) -> None:
    """A writer that claims ``fleet`` (unsigned, as open mode's recorders do) sends a start and
    two turns of ``session_id``, on its partition."""
    events = EventFactory(session_id)
    producer = Producer({"bootstrap.servers": pipeline.settings.bootstrap_servers})
    for event in (msgspec.structs.replace(events.started(), fleet=fleet),
                  events.completed(1, 0, f"{fleet} speaks"), events.completed(2, 1, "and again")):
        producer.produce(pipeline.settings.topics.events, key=session_id.encode(), value=encode_event(event),
                         headers=claim_headers(fleet), partition=partition_for(session_id, pipeline.settings.partitions))
    assert producer.flush(10) == 0


async def test_two_fleets_sessions_with_one_id_are_both_stored_and_a_record_claiming_another_fleet_is_refused(
    pipeline,
):
    assert pipeline.settings.insecure_open_fleets and not pipeline.settings.fleet_keys
    session_id = f"room-{uuid.uuid4().hex[:8]}"
    async with recorder_for(pipeline.settings) as first:
        mine = await first.start_session(session_id, fleet="fleet-a", agent_id="a")
        await mine.complete_turn(0, "user", "fleet a speaks")
        async with recorder_for(pipeline.settings) as second:  # another fleet's agent, the same room name
            theirs = await second.start_session(session_id, fleet="fleet-b", agent_id="b")
            await theirs.complete_turn(0, "user", "fleet b speaks")
            await theirs.complete_turn(1, "user", "and again")
            await theirs.end("completed")
        assert mine.session_id != theirs.session_id
        # Once fleet A's session is sequenced (it belongs to fleet A), a writer claiming fleet B
        # writes under fleet A's key.
        wait_until(lambda: stored_turns(pipeline, mine.session_id), timeout=TIMEOUT, what="fleet a's first turn stored")
        write_claiming(pipeline, mine.session_id, "fleet-b")
        await mine.complete_turn(1, "agent", "fleet a answers")
        await mine.end("completed")
    for session in (mine, theirs):
        wait_until(lambda s=session: finalized(pipeline, s.session_id), timeout=TIMEOUT,
                   what=f"{session.session_id} finalized")
    assert [t.text for t in stored_turns(pipeline, mine.session_id)] == ["fleet a speaks", "fleet a answers"]
    assert [t.text for t in stored_turns(pipeline, theirs.session_id)] == ["fleet b speaks", "and again"]
    assert (finalized(pipeline, mine.session_id)["fleet"], finalized(pipeline, theirs.session_id)["fleet"]) == (
        "fleet-a", "fleet-b")

    def refused(session_id: str) -> list[str]:
        partition = partition_for(session_id, pipeline.settings.partitions)
        records = partition_records(pipeline.settings.bootstrap_servers, pipeline.settings.topics.dlq, partition)
        return [reason_class(dict(headers)[REASON_HEADER].decode()) for key, _, headers in records
                if key == session_id.encode()]

    wait_until(lambda: len(refused(mine.session_id)) == 3, timeout=TIMEOUT,
               what="the three records claiming fleet b in the DLQ")
    assert refused(mine.session_id) == ["foreign fleet"] * 3
    assert refused(theirs.session_id) == []
