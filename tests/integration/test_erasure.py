"""Forgetting sessions on the real pipeline: one live, one finalized; then replay of the log into a
fresh Postgres and a fresh SQLite store and verify. Neither holds a word of them, every other
session is identical, and a SIGKILL between the steps of a forget is finished on recovery."""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid

import pytest
from sqlalchemy import func, select

from turnlog.deploy.processes import turnlog_command
from turnlog.ops.erasure import ErasureNotFound, request_erasure
from turnlog.ops.replay import replay_events
from turnlog.ops.verify import compare_digests, session_digests
from turnlog.producers import SessionErasedError, SessionRecorder
from turnlog.schemas.session_keys import session_key
from turnlog.sinks import open_store
from turnlog.sinks.analytics import AnalyticsProjection
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.sinks.tables import analytics_turns, erasures, session_events, sessions, transcript_turns

from tests.support import wait_until

TIMEOUT = 90
FORGOTTEN_WORDS = ("Wolverhampton", "Kilimanjaro")


def rows_of(store, session_id):
    """How many rows each content table holds of ``session_id``."""
    with store.engine.connect() as conn:
        return {
            table.name: conn.execute(select(func.count()).select_from(table).where(column == session_id)).scalar()
            for table, column in ((sessions, sessions.c.id), (session_events, session_events.c.session_id),
                                  (transcript_turns, transcript_turns.c.session_id))
        }


def all_text(store):
    """Every turn text and event payload of the store, joined: what a grep of its tables sees."""
    with store.engine.connect() as conn:
        texts = conn.execute(select(transcript_turns.c.text)).scalars().all()
        payloads = conn.execute(select(session_events.c.payload)).scalars().all()
        metadata = [str(m) for m in conn.execute(select(sessions.c.metadata)).scalars().all()]
    return "\n".join([*texts, *payloads, *metadata])


def status_of(store, session_id):
    with store.engine.connect() as conn:
        return conn.execute(select(sessions.c.status).where(sessions.c.id == session_id)).scalar()


def erasure_done(store, session_id):
    with store.engine.connect() as conn:
        return conn.execute(select(erasures.c.completed_at).where(erasures.c.session_id == session_id)).scalar()


def started_sessions(store):
    with store.engine.connect() as conn:
        return AnalyticsProjection(store).figures(conn, "tests").started_sessions


async def say(session, first_turn, words):
    for offset, word in enumerate(words):
        session.update_partial(first_turn + offset, "user", f"I live in {word}")
        await session.flush_partial()
        await session.complete_turn(first_turn + offset, "user", f"I live in {word}, really", input_tokens=2)


async def test_forgotten_sessions_leave_no_word_in_the_store_or_any_replay_and_others_stay_identical(
    new_pipeline, postgres_databases, tmp_path
):
    pipeline = new_pipeline(("sequencer", "sink", "analytics"))
    settings, store = pipeline.settings, pipeline.store
    async with SessionRecorder(settings) as recorder:
        finished = await recorder.start_session(f"done-{uuid.uuid4().hex[:8]}", fleet="tests", agent_id="a",
                                                metadata={"caller": FORGOTTEN_WORDS[0]})
        await say(finished, 0, FORGOTTEN_WORDS)
        await finished.end("hangup")
        kept = await recorder.start_session(f"kept-{uuid.uuid4().hex[:8]}", fleet="tests", agent_id="a")
        await say(kept, 0, ["Lisbon", "Porto"])
        await kept.end("hangup")
        live = await recorder.start_session(f"live-{uuid.uuid4().hex[:8]}", fleet="tests", agent_id="a")
        await say(live, 0, FORGOTTEN_WORDS)
        finalized_id, live_id, kept_id = finished.session_id, live.session_id, kept.session_id
        wait_until(lambda: status_of(store, finalized_id) == "finalized" and status_of(store, kept_id) == "finalized"
                   and rows_of(store, live_id)["transcript_turns"] == 2, timeout=TIMEOUT, what="sessions stored")
        wait_until(lambda: started_sessions(store) == 3, timeout=TIMEOUT, what="analytics counted three sessions")

        for session_id in (finalized_id, live_id):
            outcome = request_erasure(settings, store, session_id, requested_by="test", fleets=["tests"],
                                      wait_seconds=TIMEOUT)
            assert (outcome.status, outcome.published, outcome.fleet) == ("done", True, "tests")
        # The live session's recorder goes on until it has read the ledger (the sink drops what it
        # wrote meanwhile); from then on every write raises SessionErasedError.
        turn, deadline = 2, time.monotonic() + TIMEOUT
        with pytest.raises(SessionErasedError):
            while time.monotonic() < deadline:
                await say(live, turn, FORGOTTEN_WORDS[:1])
                turn += 1
        with pytest.raises(SessionErasedError):
            await live.end("hangup")
        assert recorder.spooled_events(live_id) == 0

    try:
        request_erasure(settings, store, kept_id, requested_by="test", fleets=["another-fleet"], wait_seconds=0)
        raise AssertionError("another fleet's session was forgotten")
    except ErasureNotFound:
        pass
    try:
        request_erasure(settings, store, "no-such-session", requested_by="test", wait_seconds=0)
        raise AssertionError("an unknown session was forgotten")
    except ErasureNotFound:
        pass

    # The kept session's events come after the live one's last ones: once it is stored, so is all before it.
    async with SessionRecorder(settings) as recorder:
        marker = await recorder.start_session(f"after-{uuid.uuid4().hex[:8]}", fleet="tests", agent_id="a")
        await marker.end("hangup")
    wait_until(lambda: status_of(store, marker.session_id) == "finalized", timeout=TIMEOUT, what="marker stored")
    for session_id in (finalized_id, live_id):
        assert rows_of(store, session_id) == {"sessions": 0, "session_events": 0, "transcript_turns": 0}
        assert erasure_done(store, session_id) is not None
    assert not any(word in all_text(store) for word in FORGOTTEN_WORDS)
    assert status_of(store, kept_id) == "finalized"

    def analytics_forgot():
        with store.engine.connect() as conn:
            figures = AnalyticsProjection(store).figures(conn, "tests")
            counted = conn.execute(select(func.count()).select_from(analytics_turns)
                                   .where(analytics_turns.c.session_id.in_([finalized_id, live_id]))).scalar()
        return figures if figures.started_sessions == 2 and counted == 0 else None

    figures = wait_until(analytics_forgot, timeout=TIMEOUT, what="analytics took the forgotten sessions out")
    assert figures.talk_time["user"][0] == 2  # the kept session's two turns only

    # Replay the log into a fresh Postgres and a fresh SQLite store; both skip the forgotten sessions.
    for url in (postgres_databases.create(), f"sqlite:///{tmp_path}/rebuilt.db"):
        rebuilt = open_store(url)
        upgrade_to_head(rebuilt.engine)
        result = replay_events(settings, rebuilt)
        assert result.erased >= 10, result  # both forgotten sessions' records, skipped unread
        assert not any(word in all_text(rebuilt) for word in FORGOTTEN_WORDS)
        for session_id in (finalized_id, live_id):
            assert rows_of(rebuilt, session_id) == {"sessions": 0, "session_events": 0, "transcript_turns": 0}
            assert erasure_done(rebuilt, session_id) is not None  # the rebuilt store knows them as forgotten
        live_digests = session_digests(store, [kept_id, marker.session_id])
        assert compare_digests(live_digests, session_digests(rebuilt, [kept_id, marker.session_id])) == []
        rebuilt.engine.dispose()

    verify = subprocess.run(turnlog_command("verify", "--against-log"), env=settings.as_environment(),
                            capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "2 forgotten sessions left out" in verify.stdout


async def test_a_forget_killed_before_its_ledger_record_and_a_sink_killed_mid_erasure_both_finish(new_pipeline):
    pipeline = new_pipeline(("sequencer", "sink"))
    settings, store = pipeline.settings, pipeline.store
    async with SessionRecorder(settings) as recorder:
        session = await recorder.start_session(f"kill-{uuid.uuid4().hex[:8]}", fleet="tests", agent_id="a")
        await say(session, 0, FORGOTTEN_WORDS)
        await session.end("hangup")
    session_id = session.session_id
    wait_until(lambda: status_of(store, session_id) == "finalized", timeout=TIMEOUT, what="stored")

    # The sink dies with the erasure's deletes written and not committed ...
    pipeline.stop("sink")
    pipeline.start("sink", faults="sink.after_forget=kill")
    # ... and the forget dies with the erasure pending in the store, its ledger record not written.
    forget = subprocess.run(turnlog_command("forget", session_id, "--wait", "0"),
                            env={**settings.as_environment(), "TURNLOG_FAULTS": "forget.after_request=kill"},
                            capture_output=True, text=True, timeout=120)
    assert forget.returncode == -9, forget.stdout + forget.stderr
    with store.engine.connect() as conn:
        pending = conn.execute(select(erasures).where(erasures.c.session_id == session_id)).mappings().one()
    assert (pending["published_at"], pending["completed_at"]) == (None, None)
    # The sink publishes the pending erasure itself, applies it, and is killed before its commit.
    wait_until(lambda: not pipeline.processes["sink"].alive(), timeout=TIMEOUT, what="the sink killed mid-erasure")
    assert rows_of(store, session_id)["transcript_turns"] == 2  # rolled back with the kill
    pipeline.stop("sink")
    pipeline.start("sink")
    wait_until(lambda: erasure_done(store, session_id), timeout=TIMEOUT, what="the erasure completed on recovery")
    assert rows_of(store, session_id) == {"sessions": 0, "session_events": 0, "transcript_turns": 0}
    again = subprocess.run(turnlog_command("forget", session_id, "--wait", "5"), env=settings.as_environment(),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and f"{session_id}: done" in again.stdout, again.stdout + again.stderr


async def test_a_session_the_store_never_held_is_forgotten_with_its_fleet_named_and_the_api_path_refuses_it(
    new_pipeline
):
    pipeline = new_pipeline(("sequencer", "sink"))
    settings, store = pipeline.settings, pipeline.store
    session_id = f"spooled-only-{uuid.uuid4().hex[:8]}"  # e.g. only in a dead agent's spool, broker away
    key = session_key("tests", session_id)  # what the fleet's recorder writes it under
    try:
        request_erasure(settings, store, session_id, requested_by="api:x", fleets=["tests"], fleet="tests",
                        wait_seconds=0)
        raise AssertionError("a session the store does not hold was forgotten without unstored=True")
    except ErasureNotFound:
        pass
    outcome = request_erasure(settings, store, session_id, requested_by="cli:test", fleets=["tests"], fleet="tests",
                              unstored=True, wait_seconds=TIMEOUT)
    assert (outcome.session_id, outcome.status, outcome.fleet, outcome.published) == (key, "done", "tests", True)
    # Its events, if they ever arrive, are dropped: the store holds it as forgotten.
    async with SessionRecorder(settings.model_copy(update={"spool_dir": str(pipeline.log_dir / "late")})) as recorder:
        # The recorder may learn of the erasure from the ledger first and refuse: either way nothing is stored.
        with contextlib.suppress(SessionErasedError):
            late = await recorder.start_session(session_id, fleet="tests", agent_id="a")
            await late.end("hangup")
            await late.wait_acknowledged(TIMEOUT)
    async with SessionRecorder(settings) as recorder:
        marker = await recorder.start_session(f"after-{uuid.uuid4().hex[:8]}", fleet="tests", agent_id="a")
        await marker.end("hangup")
    wait_until(lambda: status_of(store, marker.session_id) == "finalized", timeout=TIMEOUT, what="marker stored")
    assert rows_of(store, key) == {"sessions": 0, "session_events": 0, "transcript_turns": 0}
