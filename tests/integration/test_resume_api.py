"""Resuming through turnlog's API (POST /api/sessions/{id}/resume and
resume_via_api), with the real broker, Postgres and every service (the API
included) as a real process. The resuming agent has no database: its settings
name an unreachable one, and SQLAlchemy is made to fail if it is ever used."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterator

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.engine import Engine

from turnlog.deploy.processes import stop_all
from turnlog.producers import (
    ResumeBarrierTimeout,
    ResumeUnauthorizedError,
    SessionClosedError,
    SessionNotFoundError,
)
from turnlog.producers.api_client import resume_via_api
from turnlog.producers.partitioning import partition_for
from turnlog.schemas.session_keys import session_key
from turnlog.settings import TurnlogSettings
from turnlog.sinks.tables import sessions

from tests.integration.conftest import Pipeline, make_pipeline
from tests.support import free_port, recorder_for, wait_until

TIMEOUT = 90
TOKENS = {"tok-a": ["fleet-a"], "tok-b": ["fleet-b"]}
#: The smallest page the API allows (bytes of turn text): long turns then page.
PAGE_BYTES = 64 * 1024
#: Nothing listens on port 1: an agent that tried to use this would fail loudly.
UNREACHABLE_DB = "postgresql+psycopg://agent:no-such-password@127.0.0.1:1/none"


@pytest.fixture(scope="module")
def api(kafka_bootstrap, postgres_databases, tmp_path_factory) -> Iterator[Pipeline]:
    running = make_pipeline(
        kafka_bootstrap,
        postgres_databases.create(),
        tmp_path_factory.mktemp("resume-api"),
        ("sequencer", "sink", "finalizer", "api"),
        api_tokens=TOKENS,
        api_port=free_port(),
        api_page_bytes=PAGE_BYTES,
    )
    try:
        running.wait_ready()
        yield running
    finally:
        stop_all(running.processes)
        running.store.engine.dispose()


def agent_settings(pipeline: Pipeline, token: str) -> TurnlogSettings:
    """What an agent host has: the broker and the API, no database."""
    return pipeline.settings.model_copy(
        update={
            "database_url": SecretStr(UNREACHABLE_DB),
            "api_url": f"http://127.0.0.1:{pipeline.settings.api_port}",
            "api_token": SecretStr(token),
        }
    )


@pytest.fixture
def no_database(monkeypatch):
    """Any use of SQLAlchemy in this (the agent's) process fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the resuming agent touched a database")

    monkeypatch.setattr(Engine, "connect", refuse)
    monkeypatch.setattr(Engine, "begin", refuse)
    monkeypatch.setattr(Engine, "raw_connection", refuse)


async def record(settings: TurnlogSettings, local_id: str, fleet: str, *, end: bool) -> str:
    """Two completed turns (the agent's cut short by the user: barged in) and an
    unfinished third of ``fleet``'s session ``local_id``; the recorder then goes away
    without ending the session (a crashed agent), unless ``end``. Returns the session's key."""
    async with recorder_for(settings) as recorder:
        session = await recorder.start_session(local_id, fleet=fleet, agent_id="agent-1")
        await session.complete_turn(0, "user", "I'd like to cancel my order", input_tokens=7, output_tokens=0)
        await session.complete_turn(
            1, "agent", "Sure. Which order is it?", input_tokens=31, output_tokens=6, barged_in=True
        )
        session.update_partial(2, "user", "the one from last")
        await session.flush_partial()
        if end:
            await session.end("hangup")
    return session.session_id


def stored(pipeline: Pipeline, session_id: str) -> dict | None:
    with pipeline.store.engine.connect() as conn:
        row = conn.execute(
            select(sessions.c.status, sessions.c.last_seq, sessions.c.claimed_epoch).where(sessions.c.id == session_id)
        ).first()
    return dict(row._mapping) if row is not None else None


def post_resume(pipeline: Pipeline, session_id: str, token: str | None, **params) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(
        f"http://127.0.0.1:{pipeline.settings.api_port}/api/sessions/{session_id}/resume",
        headers=headers,
        params=params,
        timeout=TIMEOUT + 15,
    )


def test_an_agent_without_a_database_resumes_through_the_api_with_its_conversation(api, no_database):
    session_id = asyncio.run(record(api.settings, f"api-resume-{uuid.uuid4().hex[:8]}", "fleet-a", end=False))
    agent = agent_settings(api, "tok-a")

    # No wait for the sink here: the API's barrier is what makes the turns visible.
    grant = resume_via_api(agent.api_url, agent.api_token, session_id, timeout=TIMEOUT)

    assert (grant.session_id, grant.epoch, grant.status) == (session_id, 1, "active")
    assert [(t.turn_index, t.speaker, t.text, t.status, t.input_tokens, t.output_tokens) for t in grant.turns] == [
        (0, "user", "I'd like to cancel my order", "complete", 7, 0),
        (1, "agent", "Sure. Which order is it?", "complete", 31, 6),
        (2, "user", "the one from last", "partial", 0, 0),
    ]
    assert [t.barged_in for t in grant.turns] == [False, True, False]
    assert grant.turns[1].ended_at >= grant.turns[1].started_at and grant.turns[2].ended_at is None
    assert (grant.max_turn_index, grant.next_turn_index) == (2, 3)

    # A retry claims again: a newer epoch, which fences the one never used.
    again = resume_via_api(agent.api_url, agent.api_token, session_id, timeout=TIMEOUT)
    assert again.epoch == 2 and again.turns == grant.turns


def test_the_grant_matches_the_store_it_was_claimed_from(api):
    session_id = asyncio.run(record(api.settings, f"api-store-{uuid.uuid4().hex[:8]}", "fleet-a", end=False))
    grant = resume_via_api(agent_settings(api, "tok-a").api_url, "tok-a", session_id, timeout=TIMEOUT)
    row = stored(api, session_id)
    assert (row["status"], row["claimed_epoch"]) == ("active", grant.epoch)
    assert grant.last_seq == row["last_seq"] and grant.next_seq == row["last_seq"] + 1


def test_a_token_resumes_only_its_own_fleets_sessions_and_claims_nothing_else(api, no_database):
    session_id = asyncio.run(record(api.settings, f"api-fleet-{uuid.uuid4().hex[:8]}", "fleet-a", end=False))
    other_fleet = agent_settings(api, "tok-b")
    with pytest.raises(SessionNotFoundError):
        resume_via_api(other_fleet.api_url, other_fleet.api_token, session_id, timeout=TIMEOUT)
    with pytest.raises(SessionNotFoundError):
        resume_via_api(other_fleet.api_url, "tok-a", session_key("fleet-a", f"no-such-{uuid.uuid4().hex[:8]}"),
                       timeout=TIMEOUT)
    with pytest.raises(ResumeUnauthorizedError):
        resume_via_api(other_fleet.api_url, "not-a-token", session_id, timeout=TIMEOUT)


def test_another_fleets_attempt_leaves_the_session_unclaimed_and_bad_requests_are_refused(api):
    session_id = asyncio.run(record(api.settings, f"api-acl-{uuid.uuid4().hex[:8]}", "fleet-a", end=False))
    assert post_resume(api, session_id, "tok-b", timeout=TIMEOUT).status_code == 404
    # The barrier has run for it, so the store holds the session: still nothing claimed.
    assert stored(api, session_id)["claimed_epoch"] == 0
    unauthenticated = post_resume(api, session_id, None)
    assert unauthenticated.status_code == 401 and unauthenticated.headers["www-authenticate"] == "Bearer"
    assert post_resume(api, session_id, "tok-a", timeout=601).status_code == 422
    assert post_resume(api, session_id, "tok-a", timeout=0).status_code == 422
    assert stored(api, session_id)["claimed_epoch"] == 0
    granted = post_resume(api, session_id, "tok-a", timeout=TIMEOUT)
    assert granted.status_code == 200 and granted.headers["content-type"] == "application/json"
    assert granted.json()["epoch"] == 1 and [t["turn_index"] for t in granted.json()["turns"]] == [0, 1, 2]


def test_an_ended_session_is_not_resumable(api, no_database):
    session_id = asyncio.run(record(api.settings, f"api-ended-{uuid.uuid4().hex[:8]}", "fleet-a", end=True))
    agent = agent_settings(api, "tok-a")
    with pytest.raises(SessionClosedError, match="ended|finalized"):
        resume_via_api(agent.api_url, agent.api_token, session_id, timeout=TIMEOUT)


def test_an_ended_session_gets_409_and_nothing_is_claimed(api):
    session_id = asyncio.run(record(api.settings, f"api-409-{uuid.uuid4().hex[:8]}", "fleet-a", end=True))
    response = post_resume(api, session_id, "tok-a", timeout=TIMEOUT)
    assert response.status_code == 409
    row = stored(api, session_id)
    assert row["status"] in ("ended", "finalized") and row["claimed_epoch"] == 0


def test_a_resume_the_pipeline_cannot_serve_in_time_gets_503_then_succeeds_once_it_catches_up(api, no_database):
    agent = agent_settings(api, "tok-a")
    api.stop("sink")
    try:
        # The turns are acknowledged by the broker but no sink stores them.
        session_id = asyncio.run(record(api.settings, f"api-503-{uuid.uuid4().hex[:8]}", "fleet-a", end=False))
        response = post_resume(api, session_id, "tok-a", timeout=3)
        assert response.status_code == 503
        assert int(response.headers["retry-after"]) > 0
        assert "sink" not in response.text  # the barrier's detail stays in the API's log
        with pytest.raises(ResumeBarrierTimeout, match="503"):
            resume_via_api(agent.api_url, agent.api_token, session_id, timeout=3)
    finally:
        api.start("sink")
    grant = resume_via_api(agent.api_url, agent.api_token, session_id, timeout=TIMEOUT)
    assert grant.epoch == 1  # the timed-out attempts claimed nothing
    assert [t.text for t in grant.turns] == ["I'd like to cancel my order", "Sure. Which order is it?", "the one from last"]
    log = api.processes["api"].log_path.read_text(errors="replace")
    assert f"resume of {session_id}: resume barrier: timed out waiting for the sink" in log
    assert not any(token in log for token in TOKENS)


def test_a_recorder_with_api_url_resumes_continues_and_the_session_finalizes_without_a_database(api, no_database):
    local = f"api-recorder-{uuid.uuid4().hex[:8]}"
    session_id = asyncio.run(record(api.settings, local, "fleet-a", end=False))
    agent = agent_settings(api, "tok-a")

    async def continue_it():
        async with recorder_for(agent) as recorder:
            # By the id the agent gave it and its fleet, as an agent that kept only its own id does.
            session = await recorder.resume(local, fleet="fleet-a", timeout=TIMEOUT)
            assert session.session_id == session_id
            assert session.epoch == 1 and session.next_turn_index == 3
            assert [t.text for t in session.turns] == [
                "I'd like to cancel my order", "Sure. Which order is it?", "the one from last"
            ]
            await session.complete_turn(3, "user", "the one from last week", input_tokens=5)
            await session.end("completed")

    asyncio.run(continue_it())
    # Read back through the API as well: SQLAlchemy stays refused in this process.
    url = f"http://127.0.0.1:{api.settings.api_port}/api/sessions/{session_id}/transcript"

    def finalized_transcript():
        response = httpx.get(url, headers={"Authorization": "Bearer tok-a"}, timeout=10)
        body = response.json() if response.status_code == 200 else None
        return body if body and body["session"]["status"] == "finalized" else None

    body = wait_until(finalized_transcript, timeout=TIMEOUT, what=f"{session_id} finalized")
    assert [(t["turn_index"], t["text"], t["status"]) for t in body["turns"]] == [
        (0, "I'd like to cancel my order", "complete"),
        (1, "Sure. Which order is it?", "complete"),
        (2, "the one from last", "interrupted"),
        (3, "the one from last week", "complete"),
    ]
    assert body["session"]["epoch"] == 1


async def record_long(settings: TurnlogSettings, local_id: str, turns: int, chars: int) -> tuple[str, list[str]]:
    """``turns`` completed turns of ``chars`` characters each of fleet-a's session ``local_id``; the
    session stays open (a crashed agent). Returns the session's key and the turns' texts."""
    texts = [f"{index:03d} " + "x" * (chars - 4) for index in range(turns)]
    async with recorder_for(settings) as recorder:
        session = await recorder.start_session(local_id, fleet="fleet-a", agent_id="agent-1")
        for index, text in enumerate(texts):
            await session.complete_turn(index, "user" if index % 2 == 0 else "agent", text)
    return session.session_id, texts


def test_a_resume_whose_turns_do_not_fit_one_answer_is_completed_page_by_page(api, no_database):
    # Seven turns of 30,000 characters: two fit in 64 KiB.
    session_id, texts = asyncio.run(record_long(api.settings, f"api-pages-{uuid.uuid4().hex[:8]}", 7, 30_000))
    first = post_resume(api, session_id, "tok-a", timeout=TIMEOUT)
    assert first.status_code == 200
    body = first.json()
    assert [t["turn_index"] for t in body["turns"]] == [0, 1] and body["next_after_turn"] == 1
    assert body["max_turn_index"] == 6

    agent = agent_settings(api, "tok-a")
    grant = resume_via_api(agent.api_url, agent.api_token, session_id, timeout=TIMEOUT)
    assert [t.text for t in grant.turns] == texts and [t.turn_index for t in grant.turns] == list(range(7))
    assert grant.next_after_turn is None and grant.epoch == 2 and grant.next_turn_index == 7


def same_partition_ids(session_id: str, fleet: str, partitions: int, count: int) -> list[str]:
    """``count`` new ids of ``fleet``'s sessions whose keys are on ``session_id``'s partition (the
    barrier is per partition)."""
    wanted, prefix = partition_for(session_id, partitions), uuid.uuid4().hex[:6]
    candidates = (f"api-block-{prefix}-{n}" for n in range(100_000))
    return list(itertools.islice(
        (c for c in candidates if partition_for(session_key(fleet, c), partitions) == wanted), count
    ))


def test_scope_and_status_come_before_the_barrier_and_hidden_sessions_look_missing(api):
    ended = asyncio.run(record(api.settings, f"api-scope-{uuid.uuid4().hex[:8]}", "fleet-a", end=True))
    wait_until(lambda: (stored(api, ended) or {}).get("status") in ("ended", "finalized"), timeout=TIMEOUT,
               what=f"{ended} ended in the store")
    api.stop("sink")
    try:
        # With the sink down, a new event on the same partition holds that partition's barrier shut.
        blocker, never_started = same_partition_ids(ended, "fleet-a", api.settings.partitions, 2)
        asyncio.run(record(api.settings, blocker, "fleet-a", end=False))
        missing_id = session_key("fleet-a", never_started)
        # The owner's fleet sees the session ended in the store: 409 without waiting at the barrier.
        assert post_resume(api, ended, "tok-a", timeout=3).status_code == 409
        # Another fleet's token cannot see it, and gets what a missing session gets: the barrier's 503.
        missing = post_resume(api, missing_id, "tok-b", timeout=3)
        hidden = post_resume(api, ended, "tok-b", timeout=3)
        assert missing.status_code == hidden.status_code == 503
        assert missing.json()["detail"] == hidden.json()["detail"]
    finally:
        api.start("sink")
    assert stored(api, ended)["claimed_epoch"] == 0
