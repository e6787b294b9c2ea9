"""DELETE /api/sessions/{id} and what readers see after it, on the real broker and Postgres
with the sequencer, the sink and two API processes as real processes: a live session forgotten
through one API ends its SSE streams on both and `turnlog tail`; then 410 to its fleet, 404
to others, left out of the list; unknown and other fleets' sessions are 404 with nothing
changed; asking twice is one erasure; the audit row names the token's id, never the token;
with the broker away the erasure is 202 pending and the sink completes it."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from turnlog.api.app import ERASED_EVENT, ERASURES_PER_TOKEN, create_app
from turnlog.deploy.processes import ServiceProcess, stop_all, turnlog_command, wait_all_ready
from turnlog.schemas.session_keys import MAX_SESSION_KEY
from turnlog.sinks.tables import erasures, session_events, sessions, transcript_turns

from tests.integration.conftest import Pipeline, make_pipeline
from tests.support import SseEvent, free_port, recorder_for, sse_events, wait_until

TIMEOUT = 90
#: Longest a live stream may take to end after the DELETE answered (the ledger reaches every hub
#: within a poll; the store check runs every api_poll_seconds).
STREAM_END_SECONDS = 10
TOKENS = {"tok-a": ["fleet-a"], "tok-b": ["fleet-b"], "tok-all": ["*"]}
SECRET_WORDS = ("Wolverhampton", "Kilimanjaro")


def token_id(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Apis:
    pipeline: Pipeline
    urls: tuple[str, str]  # two API processes over the same store and topics


@pytest.fixture(scope="module")
def apis(kafka_bootstrap, postgres_databases, tmp_path_factory) -> Iterator[Apis]:
    running = make_pipeline(
        kafka_bootstrap, postgres_databases.create(), tmp_path_factory.mktemp("api-erasure"),
        ("sequencer", "sink", "api"), api_tokens=TOKENS, api_port=free_port(), api_poll_seconds=0.5,
    )
    second_port = free_port()
    second = ServiceProcess(
        "api-2", turnlog_command("api"), running.settings.model_copy(update={"api_port": second_port}).as_environment(),
        running.log_dir / "api-2.log", ready_path=running.log_dir / "api-2.ready",
    )
    running.processes["api-2"] = second
    try:
        running.wait_ready()
        wait_all_ready([second])
        yield Apis(running, (f"http://127.0.0.1:{running.settings.api_port}", f"http://127.0.0.1:{second_port}"))
    finally:
        stop_all(running.processes)
        running.store.engine.dispose()


def rows_of(store, session_id: str) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {
            table.name: conn.execute(select(func.count()).select_from(table).where(column == session_id)).scalar()
            for table, column in ((sessions, sessions.c.id), (session_events, session_events.c.session_id),
                                  (transcript_turns, transcript_turns.c.session_id))
        }


def erasure_row(store, session_id: str) -> dict | None:
    with store.engine.connect() as conn:
        row = conn.execute(select(erasures).where(erasures.c.session_id == session_id)).mappings().first()
    return None if row is None else dict(row)


def stored_events(store, session_id: str) -> int:
    return rows_of(store, session_id)["session_events"]


async def record_finished(pipeline: Pipeline, session_id: str, fleet: str) -> str:
    """Fleet ``fleet``'s session ``session_id``, one turn and its end; returns its key."""
    async with recorder_for(pipeline.settings) as recorder:
        session = await recorder.start_session(session_id, fleet=fleet, agent_id="a")
        await session.complete_turn(0, "user", f"I live in {SECRET_WORDS[0]}")
        await session.end("hangup")
    return session.session_id


def finished_session(apis: Apis, fleet: str) -> str:
    """The key of a finished session of ``fleet``, once the API shows it."""
    session_id = asyncio.run(record_finished(apis.pipeline, f"done-{uuid.uuid4().hex[:8]}", fleet))
    wait_until(lambda: httpx.get(f"{apis.urls[0]}/api/sessions/{session_id}", headers=auth("tok-all")).status_code
               == 200, timeout=TIMEOUT, what="the session stored")
    return session_id


async def follow(url: str, session_id: str, token: str, got: list[SseEvent]) -> None:
    """One SSE connection's events into ``got``, until the session ends or is forgotten."""
    async with (
        httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(10, read=60)) as client,
        client.stream("GET", f"/api/sessions/{session_id}/events", headers=auth(token)) as response,
    ):
        assert response.status_code == 200, await response.aread()
        async for event in sse_events(response.aiter_lines()):
            got.append(event)
            if event.event in ("session.ended", ERASED_EVENT):
                return


async def until(condition, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)  # a poll with a deadline


async def test_a_live_session_deleted_through_one_api_ends_its_streams_everywhere_then_is_gone(apis):
    pipeline, (url_a, url_b) = apis.pipeline, apis.urls
    store = pipeline.store
    async with recorder_for(pipeline.settings) as recorder:
        kept = await recorder.start_session(f"kept-{uuid.uuid4().hex[:8]}", fleet="fleet-a", agent_id="a")
        live = await recorder.start_session(f"live-{uuid.uuid4().hex[:8]}", fleet="fleet-a", agent_id="a")
        session_id, kept_id = live.session_id, kept.session_id
        for index, word in enumerate(SECRET_WORDS):
            live.update_partial(index, "user", f"I live in {word}")
            await live.flush_partial()
            await live.complete_turn(index, "user", f"I live in {word}, really")
        await until(lambda: stored_events(store, session_id) == 5, "the live session's events stored")

        streams: list[list[SseEvent]] = [[], [], []]
        readers = [asyncio.create_task(follow(url, session_id, token, got))
                   for url, token, got in zip((url_a, url_b, url_b), ("tok-a", "tok-a", "tok-all"), streams, strict=True)]
        kept_stream: list[SseEvent] = []
        kept_reader = asyncio.create_task(follow(url_b, kept_id, "tok-a", kept_stream))
        tail = subprocess.Popen(turnlog_command("tail", session_id), env=pipeline.settings.as_environment(),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        tail_lines: list[str] = []

        def read_tail() -> None:
            assert tail.stdout is not None
            for line in tail.stdout:
                tail_lines.append(line)

        tail_reader = threading.Thread(target=read_tail, daemon=True)
        tail_reader.start()
        await until(lambda: all(len(got) == 5 for got in streams) and len(kept_stream) == 1
                    and len(tail_lines) == 5, "the backlogs streamed and tailed")
        live.update_partial(2, "agent", "a live partial")  # on the live tail of both processes
        await live.flush_partial()
        await until(lambda: all(len(got) == 6 for got in streams) and len(tail_lines) == 6, "the live partial")

        async with httpx.AsyncClient(base_url=url_a, headers=auth("tok-a"), timeout=60) as client:
            answer = await client.delete(f"/api/sessions/{session_id}", params={"wait": 30})
        answered_at = time.monotonic()
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["session_id"], body["status"], body["requested_by"]) == (session_id, "done", f"api:{token_id('tok-a')}")
        assert body["erased_at"] is not None

        await asyncio.wait_for(asyncio.gather(*readers), STREAM_END_SECONDS)
        assert time.monotonic() - answered_at < STREAM_END_SECONDS
        for got in streams:
            assert [e.event for e in got[:6]] == [e.event for e in streams[0][:6]]
            assert got[-1].event == ERASED_EVENT and got[-1].id is None and len(got) == 7
            assert session_id in got[-1].data and not any(word in got[-1].data for word in SECRET_WORDS)
        assert await asyncio.to_thread(tail.wait, STREAM_END_SECONDS) == 4  # ended: forgotten
        tail_reader.join(10)
        assert len(tail_lines) == 6  # what it printed before the erasure, nothing after
        assert not kept_reader.done()  # another session's stream goes on
        await kept.end("hangup")
        await asyncio.wait_for(kept_reader, TIMEOUT)
        assert kept_stream[-1].event == "session.ended"

    assert rows_of(store, session_id) == {"sessions": 0, "session_events": 0, "transcript_turns": 0}
    row = erasure_row(store, session_id)
    assert row is not None and row["requested_by"] == f"api:{token_id('tok-a')}" and row["fleet"] == "fleet-a"
    assert not any("tok-a" in str(value) for value in row.values())  # the audit names the token's id only
    async with httpx.AsyncClient(timeout=30) as client:
        for url in (url_a, url_b):
            for method, path in (("GET", ""), ("GET", "/transcript"), ("GET", "/events"), ("POST", "/resume")):
                own = await client.request(method, f"{url}/api/sessions/{session_id}{path}", headers=auth("tok-a"))
                assert own.status_code == 410, (url, path, own.status_code, own.text)
                assert own.json() == {"session_id": session_id, "status": "erased",
                                      "erased_at": body["erased_at"]}
                other = await client.request(method, f"{url}/api/sessions/{session_id}{path}", headers=auth("tok-b"))
                assert other.status_code == 404, (url, path, other.status_code)
            for token in ("tok-a", "tok-all"):
                listed = (await client.get(f"{url}/api/sessions", headers=auth(token), params={"limit": 100})).json()
                ids = {s["id"] for s in listed["sessions"]}
                assert session_id not in ids and kept_id in ids
    after = subprocess.run(turnlog_command("tail", session_id), env=pipeline.settings.as_environment(),
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert after.returncode in (1, 4) and after.stdout == ""  # nothing of it is shown


def test_deleting_an_unknown_session_is_404_and_changes_nothing(apis):
    store = apis.pipeline.store
    for session_id in ("no-such-session", "x" * (MAX_SESSION_KEY + 1)):
        answer = httpx.delete(f"{apis.urls[0]}/api/sessions/{session_id}", headers=auth("tok-all"), timeout=30)
        assert answer.status_code == 404, (session_id, answer.status_code)
    assert erasure_row(store, "no-such-session") is None
    assert httpx.delete(f"{apis.urls[0]}/api/sessions/x", timeout=30).status_code == 401


def test_another_fleets_token_gets_404_and_the_session_stays_intact(apis):
    store = apis.pipeline.store
    session_id = finished_session(apis, "fleet-a")
    before = rows_of(store, session_id)
    answer = httpx.delete(f"{apis.urls[1]}/api/sessions/{session_id}", headers=auth("tok-b"), timeout=30)
    assert answer.status_code == 404
    missing = httpx.delete(f"{apis.urls[1]}/api/sessions/no-such-session", headers=auth("tok-b"), timeout=30)
    # The same answer as for a session that is not there, but for the id it names.
    assert answer.text.replace(session_id, "ID") == missing.text.replace("no-such-session", "ID")
    assert erasure_row(store, session_id) is None and rows_of(store, session_id) == before
    assert httpx.get(f"{apis.urls[0]}/api/sessions/{session_id}", headers=auth("tok-a")).status_code == 200


def test_a_second_delete_is_the_same_erasure(apis):
    store = apis.pipeline.store
    session_id = finished_session(apis, "fleet-a")
    first = httpx.delete(f"{apis.urls[0]}/api/sessions/{session_id}", headers=auth("tok-a"),
                         params={"wait": 30}, timeout=60)
    assert first.status_code == 200 and first.json()["status"] == "done", first.text
    row = erasure_row(store, session_id)
    for url, token in ((apis.urls[0], "tok-a"), (apis.urls[1], "tok-all")):
        again = httpx.delete(f"{url}/api/sessions/{session_id}", headers=auth(token), params={"wait": 0}, timeout=60)
        assert again.status_code == 200 and again.json() == first.json()  # the first request stands, done
    assert erasure_row(store, session_id) == row
    other = httpx.delete(f"{apis.urls[0]}/api/sessions/{session_id}", headers=auth("tok-b"), timeout=60)
    assert other.status_code == 404


def test_with_the_broker_away_the_erasure_is_pending_then_the_sink_completes_it(apis):
    pipeline, store = apis.pipeline, apis.pipeline.store
    session_ids = [finished_session(apis, "fleet-a") for _ in range(ERASURES_PER_TOKEN + 1)]
    # An API whose broker does not answer (nothing listens on port 1): the ledger record cannot be
    # written; each request's publication waits 5 * ack_wait_seconds = 10 s before it gives up (the
    # record itself would be retried for delivery_timeout_seconds, longer).
    away = pipeline.settings.model_copy(update={"bootstrap_servers": "127.0.0.1:1", "ack_wait_seconds": 2.0,
                                                "delivery_timeout_seconds": 60.0})
    with TestClient(create_app(away, store, live=False)) as client:
        answers = [client.delete(f"/api/sessions/{sid}", headers=auth("tok-a"), params={"wait": 0})
                   for sid in session_ids[:ERASURES_PER_TOKEN]]
        # Both still publish (10 s) after their 202 (2 s): the token is at its limit.
        busy = client.delete(f"/api/sessions/{session_ids[-1]}", headers=auth("tok-a"), params={"wait": 0})
        elsewhere = client.delete(f"/api/sessions/{session_ids[-1]}", headers=auth("tok-all"), params={"wait": 0})
    for sid, answer in zip(session_ids, answers, strict=False):
        assert answer.status_code == 202, answer.text
        assert answer.json()["status"] == "pending" and answer.json()["erased_at"] is None
        row = erasure_row(store, sid)
        assert row is not None and row["requested_by"] == f"api:{token_id('tok-a')}"
    assert busy.status_code == 429 and "Retry-After" in busy.headers
    assert elsewhere.status_code == 202  # the limit is per token
    for sid in session_ids:
        # While pending the session is already gone for readers; the sink publishes and applies it.
        listed = httpx.get(f"{apis.urls[0]}/api/sessions", headers=auth("tok-a"), params={"limit": 100}).json()
        assert sid not in {s["id"] for s in listed["sessions"]}
        wait_until(lambda sid=sid: httpx.get(f"{apis.urls[0]}/api/sessions/{sid}", headers=auth("tok-a")).json()
                   .get("status") == "erased", timeout=TIMEOUT, what="the sink completed the pending erasure")
        assert rows_of(store, sid) == {"sessions": 0, "session_events": 0, "transcript_turns": 0}
