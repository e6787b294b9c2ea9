"""`turnlog replay` and `turnlog verify` as an operator runs them, on the real broker and Postgres."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import uuid

import pytest
from sqlalchemy import delete, select, update

from turnlog.deploy.processes import turnlog_command
from turnlog.producers import SessionRecorder
from turnlog.sinks import open_store
from turnlog.sinks.tables import session_events, sessions, transcript_turns

from tests.support import dump_store, wait_until

TIMEOUT = 90


def run(pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        turnlog_command(*args), env=pipeline.settings.as_environment(), capture_output=True, text=True, timeout=300
    )


async def record(pipeline, local_id: str, turns: int, *, interrupted: bool) -> str:
    """Record fleet ops's session ``local_id``; returns its key."""
    async with SessionRecorder(pipeline.settings) as recorder:
        session = await recorder.start_session(local_id, fleet="ops", agent_id="agent-1", metadata={"case": local_id})
        for index in range(turns):
            session.update_partial(index, "user", f"turn {index} so")
            await session.flush_partial()
            await session.complete_turn(index, "user", f"turn {index} so far so good", input_tokens=2, output_tokens=3)
        if interrupted:
            session.update_partial(turns, "agent", "I was about to")
            await session.flush_partial()
        await session.end("completed")
    return session.session_id


@pytest.fixture(scope="module")
def finished(kafka_bootstrap, postgres_databases, tmp_path_factory):
    """A pipeline whose three sessions are all finalized (one ends on an interrupted turn)."""
    from turnlog.deploy.processes import stop_all

    from tests.integration.conftest import make_pipeline

    pipeline = make_pipeline(
        kafka_bootstrap, postgres_databases.create(), tmp_path_factory.mktemp("ops"), ("sequencer", "sink")
    )
    ids = [asyncio.run(record(pipeline, f"ops-{i}-{uuid.uuid4().hex[:6]}", 3 + i, interrupted=i == 1))
           for i in range(3)]

    wait_until(lambda: len(_finalized(pipeline)) == 3, timeout=TIMEOUT, what="3 sessions finalized")
    stop_all(pipeline.processes)
    yield pipeline, ids
    pipeline.store.engine.dispose()


def _finalized(pipeline):
    with pipeline.store.engine.connect() as conn:
        return conn.execute(select(sessions.c.id).where(sessions.c.status == "finalized")).scalars().all()


def test_replay_rebuilds_a_store_that_verifies_equal_to_the_live_one(finished, postgres_databases):
    pipeline, ids = finished
    rebuilt = postgres_databases.create()
    done = run(pipeline, "replay", "--database-url", rebuilt)
    assert done.returncode == 0, done.stderr
    assert "records/s" in done.stdout and "3 finalized" in done.stdout
    store = open_store(rebuilt)
    with store.engine.connect() as conn:
        statuses = dict(conn.execute(select(sessions.c.id, sessions.c.status)).all())
        interrupted = conn.execute(select(transcript_turns.c.session_id).where(transcript_turns.c.status == "interrupted")).scalars().all()
    store.engine.dispose()
    assert statuses == {sid: "finalized" for sid in ids}
    assert interrupted == [ids[1]]
    against = run(pipeline, "verify", "--database-url", pipeline.settings.database_url.get_secret_value(), "--against-url", rebuilt)
    assert against.returncode == 0, against.stdout + against.stderr
    assert "0 differing sessions" in against.stdout


def test_verify_against_the_log_finds_no_difference(finished):
    pipeline, _ = finished
    done = run(pipeline, "verify", "--database-url", pipeline.settings.database_url.get_secret_value(), "--against-log")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 differing sessions" in done.stdout


def test_replaying_into_a_store_of_finalized_sessions_changes_nothing(finished, postgres_databases):
    pipeline, _ = finished
    target = postgres_databases.create()
    assert run(pipeline, "replay", "--database-url", target).returncode == 0
    store = open_store(target)
    before = dump_store(store, skip_columns=())
    again = run(pipeline, "replay", "--database-url", target)
    assert again.returncode == 0, again.stderr
    assert "3 already settled, left alone" in again.stdout
    assert dump_store(store, skip_columns=()) == before  # finalized_at included
    store.engine.dispose()


def test_verify_lists_every_differing_session(finished, postgres_databases):
    pipeline, ids = finished
    target = postgres_databases.create()
    assert run(pipeline, "replay", "--database-url", target).returncode == 0
    store = open_store(target)
    with store.engine.begin() as conn:
        conn.execute(
            update(transcript_turns)
            .where(transcript_turns.c.session_id == ids[0], transcript_turns.c.turn_index == 1)
            .values(text="tampered")
        )
        conn.execute(update(sessions).where(sessions.c.id == ids[2]).values(output_tokens=0))
        # The event log counts too: what the SSE stream serves.
        conn.execute(delete(session_events).where(session_events.c.session_id == ids[1], session_events.c.seq == 2))
    store.engine.dispose()
    done = run(pipeline, "verify", "--database-url", pipeline.settings.database_url.get_secret_value(), "--against-url", target)
    assert done.returncode == 1
    assert "3 differing sessions" in done.stdout
    assert f"{ids[0]}: turn 1: text differ" in done.stdout
    assert f"{ids[2]}: output_tokens:" in done.stdout
    # "  <session key>: <difference>"; the key itself holds a ':' (its fleet's end)
    listed = [line.strip().split(": ", 1)[0] for line in done.stdout.splitlines() if line.startswith("  ")]
    assert listed == [ids[0], ids[1], ids[2]]
    assert f"{ids[1]}: events: seqs only in A [2]" in done.stdout  # deleted from B


def test_replay_of_chosen_sessions_or_from_a_time(finished, postgres_databases):
    pipeline, ids = finished
    only = postgres_databases.create()
    assert run(pipeline, "replay", "--database-url", only, "--session", ids[1]).returncode == 0
    store = open_store(only)
    with store.engine.connect() as conn:
        assert conn.execute(select(sessions.c.id)).scalars().all() == [ids[1]]
    store.engine.dispose()
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    none = run(pipeline, "replay", "--database-url", postgres_databases.create(), "--from-time", later)
    assert none.returncode == 0 and "replayed 0 records" in none.stdout
    # From the middle of the log: sessions whose start is cut off are reported, not silently dropped.
    with pipeline.store.engine.connect() as conn:
        midway = conn.execute(
            select(session_events.c.emitted_at).where(session_events.c.session_id == ids[2], session_events.c.seq == 3)
        ).scalar_one()
    cut = run(pipeline, "replay", "--database-url", postgres_databases.create(), "--from-time", midway.isoformat())
    assert cut.returncode == 0, cut.stderr
    assert "sessions left incomplete" in cut.stderr and ids[2] in cut.stderr
    bad = run(pipeline, "replay", "--database-url", only, "--from-time", "yesterday")
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr


def test_replay_into_a_store_that_lost_a_sessions_tail_repairs_it(finished, postgres_databases):
    pipeline, ids = finished
    target = postgres_databases.create()
    assert run(pipeline, "replay", "--database-url", target).returncode == 0
    store = open_store(target)
    # The store lost everything after seq 3 of one session (as if the transcript had
    # dropped it), and the session is still active there.
    with store.engine.begin() as conn:
        conn.execute(delete(session_events).where(session_events.c.session_id == ids[1], session_events.c.seq > 3))
        conn.execute(delete(transcript_turns).where(transcript_turns.c.session_id == ids[1], transcript_turns.c.turn_index > 0))
        conn.execute(
            update(sessions)
            .where(sessions.c.id == ids[1])
            .values(status="active", last_seq=3, max_seq=3, end_seq=None, ended_at=None, end_reason=None,
                    turn_count=None, interrupted_turn_count=None, duration_seconds=None, input_tokens=None,
                    output_tokens=None, finalized_at=None)
        )
    store.engine.dispose()
    broken = run(pipeline, "verify", "--database-url", pipeline.settings.database_url.get_secret_value(), "--against-url", target)
    assert broken.returncode == 1 and ids[1] in broken.stdout
    repaired = run(pipeline, "replay", "--database-url", target, "--session", ids[1])
    assert repaired.returncode == 0, repaired.stderr
    assert "1 finalized" in repaired.stdout
    again = run(pipeline, "verify", "--database-url", pipeline.settings.database_url.get_secret_value(), "--against-url", target)
    assert again.returncode == 0, again.stdout
