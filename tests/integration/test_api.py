"""The HTTP API, SSE resume, `turnlog tail` and the analytics projection, on the real
broker and Postgres, with every service (API included) as a real process."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import random
import subprocess
import uuid
from collections.abc import Iterator

import httpx
import msgspec
import pytest
from sqlalchemy import select

from turnlog.deploy.processes import stop_all, turnlog_command
from turnlog.schemas.session_keys import session_key
from turnlog.sinks.tables import session_events, transcript_turns

from tests.integration.conftest import Pipeline, make_pipeline
from tests.support import free_port, recorder_for, sse_events, wait_until

TIMEOUT = 90
TOKENS = {"tok-a": ["fleet-a"], "tok-b": ["fleet-b"], "tok-all": ["*"], "tok-none": ["nobody"]}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def api(kafka_bootstrap, postgres_databases, tmp_path_factory) -> Iterator[Pipeline]:
    """The whole pipeline plus the analytics projection and the API, on a fresh database."""
    running = make_pipeline(
        kafka_bootstrap,
        postgres_databases.create(),
        tmp_path_factory.mktemp("api"),
        ("sequencer", "sink", "finalizer", "analytics", "api"),
        api_tokens=TOKENS,
        api_port=free_port(),
        api_poll_seconds=0.5,
    )
    try:
        running.wait_ready()
        yield running
    finally:
        stop_all(running.processes)
        running.store.engine.dispose()


def base_url(pipeline: Pipeline) -> str:
    return f"http://127.0.0.1:{pipeline.settings.api_port}"


def get(pipeline: Pipeline, path: str, token: str | None = "tok-all", **params) -> httpx.Response:
    return httpx.get(base_url(pipeline) + path, headers=auth(token) if token else {}, params=params, timeout=10)


def all_sessions(pipeline: Pipeline, token: str, **filters) -> list[dict]:
    """Every session the token lists, page by page (the API's largest page is 100)."""
    rows, cursor = [], None
    while True:
        body = get(pipeline, "/api/sessions", token, limit=100, **filters, **({"cursor": cursor} if cursor else {})).json()
        rows += body["sessions"]
        cursor = body["next_cursor"]
        if cursor is None:
            return rows


def stored_events(pipeline: Pipeline, session_id: str) -> list[tuple[int, str]]:
    with pipeline.store.engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                select(session_events.c.seq, session_events.c.payload)
                .where(session_events.c.session_id == session_id)
                .order_by(session_events.c.seq)
            )
        ]


async def stored_through(pipeline: Pipeline, session_id: str, last_seq: int) -> list[tuple[int, str]]:
    """The stored events once the store holds ``last_seq`` (the live tail can be ahead of the sink)."""

    def probe():
        events = stored_events(pipeline, session_id)
        return events if events and events[-1][0] >= last_seq else None

    return await asyncio.to_thread(wait_until, probe, timeout=TIMEOUT, what=f"{session_id} stored through {last_seq}")


def visible(pipeline: Pipeline, session_id: str, status: str | None = None) -> bool:
    response = get(pipeline, f"/api/sessions/{session_id}")
    return response.status_code == 200 and (status is None or response.json()["status"] == status)


async def record_session(pipeline: Pipeline, session_id: str, fleet: str, turns: int, *, pause: float = 0.0) -> str:
    """A session of ``turns`` turns, each with two growing partials, then its end; returns its key."""
    async with recorder_for(pipeline.settings) as recorder:
        session = await recorder.start_session(session_id, fleet=fleet, agent_id="agent-1")
        for index in range(turns):
            speaker = "agent" if index % 2 else "user"
            words = f"turn {index} says something fairly ordinary".split()
            for upto in (2, 4):
                session.update_partial(index, speaker, " ".join(words[:upto]))
                await session.flush_partial()
            await session.complete_turn(index, speaker, " ".join(words), input_tokens=index, output_tokens=1)
            if pause:
                await asyncio.sleep(pause)  # paces the workload while a subscriber reads; not a sync
        await session.end("completed")
    return session.session_id


# -- access control -------------------------------------------------------------
def test_requests_without_a_valid_token_get_401_and_tokens_stay_out_of_the_logs(api):
    for token in (None, "wrong-token"):
        for path in ("/api/sessions", "/api/sessions/x", "/api/sessions/x/events", "/api/fleets/fleet-a/analytics"):
            response = get(api, path, token)
            assert response.status_code == 401, (path, token)
            assert response.headers["www-authenticate"] == "Bearer"
    assert get(api, "/api/sessions", "tok-a").status_code == 200
    log = api.processes["api"].log_path.read_text(errors="replace")
    assert "GET /api/sessions" in log  # the access log is on, and still:
    assert not any(token in log for token in (*TOKENS, "wrong-token"))


def test_a_token_never_reads_another_fleets_session(api):
    mine = asyncio.run(record_session(api, f"acl-a-{uuid.uuid4().hex[:6]}", "fleet-a", 1))
    theirs = asyncio.run(record_session(api, f"acl-b-{uuid.uuid4().hex[:6]}", "fleet-b", 1))
    wait_until(lambda: visible(api, mine, "finalized") and visible(api, theirs, "finalized"), timeout=TIMEOUT, what="both finalized")
    for path in ("", "/transcript", "/events"):
        assert get(api, f"/api/sessions/{theirs}{path}", "tok-a").status_code == 404, path
        assert get(api, f"/api/sessions/{mine}{path}", "tok-b").status_code == 404, path
    assert get(api, f"/api/sessions/{mine}/transcript", "tok-a").status_code == 200
    listed = {s["id"] for s in all_sessions(api, "tok-a")}
    assert mine in listed and theirs not in listed
    assert get(api, "/api/sessions", "tok-a", fleet="fleet-b").json()["sessions"] == []
    assert get(api, "/api/fleets/fleet-b/analytics", "tok-a").status_code == 404
    assert get(api, "/api/sessions", "tok-none").json()["sessions"] == []


# -- reads ------------------------------------------------------------------------
def test_list_filters_and_pages_through_sessions(api):
    fleet = "fleet-c"  # no other test of the module records as it
    ids = [asyncio.run(record_session(api, f"list-{fleet}-{i}", fleet, 1)) for i in range(5)]
    wait_until(lambda: all(visible(api, s, "finalized") for s in ids), timeout=TIMEOUT, what="5 sessions finalized")
    pages, cursor = [], None
    while True:
        params = {"fleet": fleet, "limit": 2, **({"cursor": cursor} if cursor else {})}
        body = get(api, "/api/sessions", **params).json()
        pages.append([s["id"] for s in body["sessions"]])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == [ids[0:2], ids[2:4], ids[4:5]]
    whole = get(api, "/api/sessions", fleet=fleet, limit=5).json()
    assert len(whole["sessions"]) == 5 and whole["next_cursor"] is None  # a full last page is still the last
    assert len(get(api, "/api/sessions", fleet=fleet, status="finalized", limit=50).json()["sessions"]) == 5
    assert get(api, "/api/sessions", fleet=fleet, status="active").json()["sessions"] == []
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    assert get(api, "/api/sessions", fleet=fleet, started_after=future).json()["sessions"] == []
    assert len(get(api, "/api/sessions", fleet=fleet, started_before=future).json()["sessions"]) == 5
    assert get(api, "/api/sessions", status="bogus").status_code == 422
    for params in ({"cursor": "\x00"}, {"fleet": "a\x00"}, {"started_after": "0001-01-01T00:00:00+05:00"},
                   {"started_before": "9999-12-31T23:59:59-05:00"}):
        assert get(api, "/api/sessions", **params).status_code == 422, params
    assert get(api, "/api/sessions/a%00b").status_code == 404
    assert get(api, "/api/fleets/a%00/analytics").status_code == 404


def test_a_session_shows_its_durable_position_aggregates_and_transcript(api):
    session_id = asyncio.run(record_session(api, f"detail-{uuid.uuid4().hex[:6]}", "fleet-a", 3))
    wait_until(lambda: visible(api, session_id, "finalized"), timeout=TIMEOUT, what="finalized")
    detail = get(api, f"/api/sessions/{session_id}", "tok-a").json()
    events = stored_events(api, session_id)
    assert detail["last_seq"] == detail["end_seq"] == events[-1][0] == 3 * 3 + 1
    assert (detail["turn_count"], detail["input_tokens"], detail["output_tokens"]) == (3, 0 + 1 + 2, 3)
    transcript = get(api, f"/api/sessions/{session_id}/transcript", "tok-a").json()
    assert [(t["turn_index"], t["status"], t["speaker"]) for t in transcript["turns"]] == [
        (0, "complete", "user"),
        (1, "complete", "agent"),
        (2, "complete", "user"),
    ]
    assert get(api, "/api/sessions/no-such-session").status_code == 404


async def record_barge_in(pipeline: Pipeline, session_id: str) -> str:
    """The user cuts the agent short (turn 0), the agent answers (turn 1), and turn 2 is left unfinished;
    returns the session's key."""
    async with recorder_for(pipeline.settings) as recorder:
        session = await recorder.start_session(session_id, fleet="fleet-a", agent_id="agent-1")
        session.update_partial(0, "agent", "Your order ships on")
        await session.flush_partial()
        await session.complete_turn(0, "agent", "Your order ships on Mon", output_tokens=5, barged_in=True)
        await session.complete_turn(1, "user", "Wait, which order?", input_tokens=4)
        session.update_partial(2, "agent", "The one from")
        await session.flush_partial()
        await session.end("hangup")
    return session.session_id


def test_the_transcript_flags_a_barged_in_turn_apart_from_an_interrupted_one(api):
    session_id = asyncio.run(record_barge_in(api, f"barge-{uuid.uuid4().hex[:6]}"))
    wait_until(lambda: visible(api, session_id, "finalized"), timeout=TIMEOUT, what="finalized")
    transcript = get(api, f"/api/sessions/{session_id}/transcript", "tok-a").json()
    assert [(t["turn_index"], t["status"], t["barged_in"], t["text"]) for t in transcript["turns"]] == [
        (0, "complete", True, "Your order ships on Mon"),
        (1, "complete", False, "Wait, which order?"),
        (2, "interrupted", False, "The one from"),
    ]
    detail = transcript["session"]
    # A barged-in turn is a completed turn: counted, its tokens summed, not interrupted.
    assert (detail["turn_count"], detail["interrupted_turn_count"], detail["input_tokens"], detail["output_tokens"]) == (3, 1, 4, 5)
    completed = [msgspec.json.decode(payload) for _, payload in stored_events(api, session_id) if '"turn.completed"' in payload]
    assert [(e["turn_index"], e["schema_version"], e.get("barged_in")) for e in completed] == [(0, 2, True), (1, 1, None)]


# -- SSE ----------------------------------------------------------------------------
async def read_stream(pipeline, session_id, *, token="tok-all", headers=None, params=None, limit=None):
    """Events of one SSE connection: until session.ended, or after ``limit`` events (then disconnect)."""
    got = []
    async with (
        httpx.AsyncClient(base_url=base_url(pipeline), timeout=httpx.Timeout(10, read=60)) as client,
        client.stream(
            "GET", f"/api/sessions/{session_id}/events", headers={**auth(token), **(headers or {})}, params=params
        ) as response,
    ):
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for event in sse_events(response.aiter_lines()):
            got.append(event)
            if event.event == "session.ended" or (limit is not None and len(got) >= limit):
                break
    return got


async def wait_visible(pipeline, session_id):
    async with httpx.AsyncClient(base_url=base_url(pipeline), headers=auth("tok-all")) as client:
        for _ in range(TIMEOUT * 10):
            if (await client.get(f"/api/sessions/{session_id}")).status_code == 200:
                return
            await asyncio.sleep(0.1)  # a poll with a deadline (the loop bound)
    raise AssertionError(f"{session_id} never appeared in the API")


async def test_stream_gives_backlog_then_live_tail_without_gap_or_duplicate(api):
    local_id = f"sse-{uuid.uuid4().hex[:6]}"
    session_id = session_key("fleet-a", local_id)  # read while it is recorded
    writer = asyncio.create_task(record_session(api, local_id, "fleet-a", 12, pause=0.15))
    await wait_visible(api, session_id)
    got = await read_stream(api, session_id, token="tok-a")
    await writer
    stored = await stored_through(api, session_id, int(got[-1].id))
    assert [(int(e.id), e.data) for e in got] == stored
    assert [e.event for e in got][:1] == ["session.started"] and got[-1].event == "session.ended"
    kinds = {msgspec.json.decode(e.data)["type"] for e in got}
    assert kinds == {"session.started", "turn.partial", "turn.completed", "session.ended"}


async def test_stream_resumes_after_last_event_id_or_the_after_parameter(api):
    session_id = await record_session(api, f"resume-{uuid.uuid4().hex[:6]}", "fleet-a", 2)
    await asyncio.to_thread(wait_until, lambda: visible(api, session_id, "finalized"), timeout=TIMEOUT, what="finalized")
    last = len(stored_events(api, session_id)) - 1
    by_param = await read_stream(api, session_id, params={"after": 3})
    assert [int(e.id) for e in by_param] == list(range(4, last + 1))
    by_header = await read_stream(api, session_id, headers={"Last-Event-ID": "5"}, params={"after": 1})
    assert [int(e.id) for e in by_header] == list(range(6, last + 1))  # the header wins
    async with httpx.AsyncClient(base_url=base_url(api), headers=auth("tok-all")) as client:
        bad = await client.get(f"/api/sessions/{session_id}/events", headers={"Last-Event-ID": "not-a-seq"})
        # Resumed at (or past) the end: 204, which tells an EventSource to stop reconnecting.
        at_end = await client.get(f"/api/sessions/{session_id}/events", headers={"Last-Event-ID": str(last)})
        past_end = await client.get(f"/api/sessions/{session_id}/events", params={"after": 10**15})
    assert bad.status_code == 400
    assert at_end.status_code == 204 and past_end.status_code == 204
    # Out of range: a 400 or 422 at the edge, never a 500 or a traceback in the API's log.
    async with httpx.AsyncClient(base_url=base_url(api), headers=auth("tok-all")) as client:
        huge = await client.get(f"/api/sessions/{session_id}/events",
                                headers={"Last-Event-ID": "-99999999999999999999999999"})
        too_far = await client.get(f"/api/sessions/{session_id}/events", params={"after": 2**64})
    assert huge.status_code == 400 and too_far.status_code == 422
    assert "Traceback" not in api.processes["api"].log_path.read_text(errors="replace")


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_subscriber_reconnecting_at_random_points_gets_every_event_once_in_order(api, seed):
    rng = random.Random(seed)
    local_id = f"reconnect-{seed}-{uuid.uuid4().hex[:6]}"
    session_id = session_key("fleet-a", local_id)  # read while it is recorded
    writer = asyncio.create_task(record_session(api, local_id, "fleet-a", 10, pause=0.1))
    await wait_visible(api, session_id)
    received, connections = [], 0
    while not received or received[-1].event != "session.ended":
        headers = {"Last-Event-ID": received[-1].id} if received else {}
        received += await read_stream(api, session_id, headers=headers, limit=rng.randint(1, 9))
        connections += 1
    await writer
    assert connections > 3
    assert [(int(e.id), e.data) for e in received] == await stored_through(api, session_id, int(received[-1].id))


# -- the API's own surface ------------------------------------------------------------
def test_the_docs_are_off_and_every_answer_carries_the_security_headers(api):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert get(api, path, None).status_code == 404, path
    page = get(api, "/live", None)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self';" in page.headers["content-security-policy"]
    for answer in (page, get(api, "/live.js", None), get(api, "/api/sessions"), get(api, "/api/sessions", None)):
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["x-frame-options"] == "DENY" and answer.headers["referrer-policy"] == "no-referrer"


def test_the_session_list_and_the_transcript_are_paged_and_leave_metadata_out(api):
    session_id = asyncio.run(record_session(api, f"paged-{uuid.uuid4().hex[:6]}", "fleet-a", 5))
    wait_until(lambda: visible(api, session_id, "finalized"), timeout=TIMEOUT, what="finalized")
    assert "metadata" not in all_sessions(api, "tok-a")[0]
    assert "metadata" in all_sessions(api, "tok-a", include="metadata")[0]
    pages, after = [], -1
    while after is not None:
        body = get(api, f"/api/sessions/{session_id}/transcript", "tok-a", limit=2, after_turn=after).json()
        pages.append([t["turn_index"] for t in body["turns"]])
        after = body["next_after_turn"]
    assert pages == [[0, 1], [2, 3], [4]]
    assert get(api, "/api/sessions", limit=101).status_code == 422


# -- tail ---------------------------------------------------------------------------
def test_tail_prints_the_session_until_it_ends(api):
    session_id = asyncio.run(record_session(api, f"tail-{uuid.uuid4().hex[:6]}", "fleet-a", 2))
    wait_until(lambda: visible(api, session_id), timeout=TIMEOUT, what="session stored")
    env = api.settings.as_environment()
    done = subprocess.run(
        turnlog_command("tail", session_id, "--after", "3"), env={**env}, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("[4] #1 agent: turn 1")  # seq 4: turn 1's first partial
    assert lines[-2] == "[6] #1 agent: turn 1 says something fairly ordinary"
    assert lines[-1] == "[7] -- session ended: completed"
    at_end = subprocess.run(turnlog_command("tail", session_id, "--after", "7"), env=env, capture_output=True, text=True, timeout=60)
    assert at_end.returncode == 0 and at_end.stdout == ""  # nothing follows the end: it returns at once
    missing = subprocess.run(turnlog_command("tail", "no-such-session"), env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no session" in missing.stderr


def test_tail_on_a_store_without_the_schema_says_to_migrate(tmp_path):
    empty = {**os.environ, "TURNLOG_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}"}
    done = subprocess.run(turnlog_command("tail", "any-session"), env=empty, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "run `turnlog migrate`" in done.stderr and "Traceback" not in done.stderr


# -- analytics ------------------------------------------------------------------------
def test_analytics_projection_counts_each_fleet_once(api):
    fleet = "fleet-d"  # no other test of the module records as it
    ids = [asyncio.run(record_session(api, f"an-{fleet}-{i}", fleet, 4)) for i in range(3)]

    def figures():
        body = get(api, f"/api/fleets/{fleet}/analytics").json()
        return body if body["ended_sessions"] == 3 and sum(m["turns"] for m in body["turns_per_minute"]) == 12 else None

    body = wait_until(figures, timeout=TIMEOUT, what="analytics for 3 ended sessions")
    assert (body["started_sessions"], body["active_sessions"]) == (3, 0)
    with api.store.engine.connect() as conn:
        rows = conn.execute(
            select(transcript_turns.c.speaker, transcript_turns.c.started_at, transcript_turns.c.ended_at).where(
                transcript_turns.c.session_id.in_(ids)
            )
        ).all()
    expected: dict[str, list[float]] = {}
    for speaker, started, ended in rows:
        expected.setdefault(speaker, []).append((ended - started).total_seconds())
    assert {s: f["turns"] for s, f in body["talk_time"].items()} == {s: len(v) for s, v in expected.items()}
    for speaker, durations in expected.items():
        assert body["talk_time"][speaker]["seconds"] == pytest.approx(sum(durations))
