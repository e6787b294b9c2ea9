"""The HTTP API's bounds, over a SQLite store (no broker: the transcript hub is off
and the resume barrier is a stand-in): caps and limits answered 429 with
Retry-After, queued resumes answered at their deadline, range-checked inputs
answered 4xx (never 500), pages bounded in rows and bytes, the docs off by
default, and the security headers on every response."""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import pytest
from fastapi.testclient import TestClient

from turnlog.api import live as api_live
from turnlog.api.app import CUTOFF_EVENT, create_app
from turnlog.follow import FollowerFellBehind
from turnlog.producers.exceptions import SessionErasedError
from turnlog.producers.grant import ResumeGrant
from turnlog.schemas.erasure import Erasure
from turnlog.schemas.session_keys import MAX_SESSION_KEY
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore
from turnlog.sinks.reads import StoredEvent

from tests.api_server import serve
from tests.support import EventFactory, messages, sqlite_store, wait_until

TOKENS = {"tok-a": ["fleet-a"], "tok-b": ["fleet-b"], "tok-c": ["fleet-a"], "tok-all": ["*"]}
TIMEOUT = 30


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    with sqlite_store(tmp_path / "store.db") as store:
        yield store


def settings(**overrides: object) -> TurnlogSettings:
    return TurnlogSettings(api_tokens=TOKENS, api_poll_seconds=0.2, **overrides)


def record(store: SqlStore, session_id: str, fleet: str, *, turns: int = 0, text: str = "words", ended: bool = False,
           metadata: dict | None = None) -> None:
    """A session of ``fleet`` with ``turns`` completed turns (``text`` each), ended or not."""
    f = EventFactory(session_id)
    events = [msgspec.structs.replace(f.started(), fleet=fleet, metadata=metadata or {})]
    events += [f.completed(index + 1, index, f"{text} {index}") for index in range(turns)]
    if ended:
        events.append(f.ended(turns + 1, last_turn=turns - 1 if turns else None))
    with store.engine.begin() as conn:
        store.apply_batch(conn, None, messages(events))


class Barrier:
    """The resume barrier's stand-in: records each session it is asked for; a session in
    ``held`` waits until ``release`` is set. Grants an empty active session."""

    def __init__(self, *held: str) -> None:
        self.held = set(held)
        self.calls: list[str] = []
        self.release = threading.Event()

    def grant(self, session_id, timeout, *, fleets=None, turn_limit=None, max_bytes=None):
        self.calls.append(session_id)
        if session_id in self.held:
            assert self.release.wait(TIMEOUT), "the test never released the barrier"
        return ResumeGrant(session_id, epoch=1, status="active", last_seq=0, max_turn_index=None)

    def close(self) -> None:
        self.release.set()


# -- resume: the per-token limit and the deadline of queued work ---------------------
def test_a_token_past_its_resume_limit_gets_429_and_other_tokens_still_resume(store):
    barrier = Barrier("held-a")
    app = create_app(settings(api_resume_workers=4, api_resume_per_token=1), store, live=False, barrier=barrier)
    with serve(app) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as client, ThreadPoolExecutor(2) as pool:
        held = pool.submit(client.post, "/api/sessions/held-a/resume", headers=auth("tok-a"), params={"timeout": 20})
        wait_until(lambda: "held-a" in barrier.calls, timeout=TIMEOUT, what="the first resume at the barrier")
        busy = client.post("/api/sessions/other-a/resume", headers=auth("tok-a"), params={"timeout": 20})
        assert busy.status_code == 429
        assert int(busy.headers["retry-after"]) >= 1
        assert client.post("/api/sessions/s-b/resume", headers=auth("tok-b"), params={"timeout": 20}).status_code == 200
        barrier.release.set()
        assert held.result(TIMEOUT).status_code == 200
        # The slot is back once the first resume finished.
        again = client.post("/api/sessions/other-a/resume", headers=auth("tok-a"), params={"timeout": 20})
        assert again.status_code == 200
    assert barrier.calls == ["held-a", "s-b", "other-a"]  # the refused one never reached the barrier


def test_a_queued_resume_is_answered_503_at_its_deadline_and_never_runs(store):
    barrier = Barrier("held-a")
    app = create_app(settings(api_resume_workers=1, api_resume_per_token=1), store, live=False, barrier=barrier)
    with serve(app) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as client, ThreadPoolExecutor(2) as pool:
        held = pool.submit(client.post, "/api/sessions/held-a/resume", headers=auth("tok-a"), params={"timeout": 25})
        wait_until(lambda: "held-a" in barrier.calls, timeout=TIMEOUT, what="the only worker busy")
        # The only worker stays busy until the test releases it, after this answer: a queued
        # request not answered at its own deadline would wait for it and time the client out.
        queued = client.post("/api/sessions/queued-b/resume", headers=auth("tok-b"), params={"timeout": 0.5})
        assert queued.status_code == 503
        assert int(queued.headers["retry-after"]) >= 1
        barrier.release.set()
        assert held.result(TIMEOUT).status_code == 200
        # tok-b's slot came back with the cancellation, and the cancelled work never ran.
        assert client.post("/api/sessions/next-b/resume", headers=auth("tok-b"), params={"timeout": 5}).status_code == 200
    assert barrier.calls == ["held-a", "next-b"]


def test_resume_inputs_out_of_range_are_refused_before_any_work(store):
    barrier = Barrier()
    app = create_app(settings(), store, live=False, barrier=barrier)
    with TestClient(app, raise_server_exceptions=False) as client:
        for timeout in ("0", "-1", "601", "nan", "inf", "1e309", "abc"):
            answer = client.post("/api/sessions/s/resume", headers=auth("tok-a"), params={"timeout": timeout})
            assert answer.status_code == 422, timeout
        assert client.post("/api/sessions/" + "x" * (MAX_SESSION_KEY + 1) + "/resume", headers=auth("tok-a")).status_code == 404
    assert barrier.calls == []


class ForgottenAtTheBarrier:
    """The resume barrier's stand-in for a session whose erasure is asked for while it waits
    there: the erasure is recorded in the store, and the barrier's claim refuses the session."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def grant(self, session_id, timeout, *, fleets=None, turn_limit=None, max_bytes=None):
        with self.store.engine.begin() as conn:
            self.store.erasures.request(conn, Erasure(session_id=session_id, fleet="fleet-a", requested_by="cli:test",
                                                      requested_at=dt.datetime.now(dt.UTC)))
        raise SessionErasedError(session_id)

    def close(self) -> None:
        pass


def test_a_session_forgotten_while_at_the_barrier_is_410_to_its_fleet_and_404_to_others(store):
    record(store, "forgotten-a", "fleet-a", turns=2)
    record(store, "forgotten-b", "fleet-a", turns=2)
    record(store, "forgotten-c", "fleet-a", turns=2)
    app = create_app(settings(), store, live=False, barrier=ForgottenAtTheBarrier(store))
    with TestClient(app, raise_server_exceptions=False) as client:
        own = client.post("/api/sessions/forgotten-a/resume", headers=auth("tok-a"), params={"timeout": 5})
        assert own.status_code == 410 and own.json()["status"] == "pending"
        assert "words" not in own.text
        other = client.post("/api/sessions/forgotten-b/resume", headers=auth("tok-all"), params={"timeout": 5})
        assert other.status_code == 410  # a token of every fleet sees it as forgotten too
        hidden = client.post("/api/sessions/forgotten-c/resume", headers=auth("tok-b"), params={"timeout": 5})
        assert hidden.status_code == 404  # another fleet's erasure: never confirm the session exists


# -- live streams: caps, the slot's release, the cut-off ------------------------------
def open_stream(client: httpx.Client, session_id: str, token: str) -> httpx.Response:
    request = client.build_request("GET", f"/api/sessions/{session_id}/events", headers=auth(token))
    return client.send(request, stream=True)


def first_event_id(response: httpx.Response) -> str:
    """The id of the stream's first event; the stream stays open (closing the line iterator
    would close the response)."""
    lines = response.iter_lines()
    response.extensions["lines"] = lines  # kept with the response, so the iterator is not finalized
    for line in lines:
        if line.startswith("id:"):
            return line.removeprefix("id:").strip()
    raise AssertionError("the stream ended before its first event")


def test_live_streams_are_capped_per_token_and_in_all(store):
    record(store, "live-a", "fleet-a")
    record(store, "live-b", "fleet-b")
    app = create_app(settings(api_max_streams=2, api_max_streams_per_token=1), store, live=False)
    with serve(app) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        first = open_stream(client, "live-a", "tok-a")
        assert first.status_code == 200 and first_event_id(first) == "0"
        second = client.get("/api/sessions/live-a/events", headers=auth("tok-a"))
        assert second.status_code == 429 and int(second.headers["retry-after"]) >= 1
        other = open_stream(client, "live-b", "tok-b")
        assert other.status_code == 200 and first_event_id(other) == "0"
        # Two streams are open in all: a third token is refused too.
        assert client.get("/api/sessions/live-a/events", headers=auth("tok-c")).status_code == 429
        first.close()

        def reopened() -> httpx.Response | None:
            response = open_stream(client, "live-a", "tok-a")
            if response.status_code == 200:
                return response
            assert response.status_code == 429
            response.close()
            return None

        again = wait_until(reopened, timeout=TIMEOUT, what="the closed stream's slot given back")
        assert first_event_id(again) == "0"
        again.close()
        other.close()


def test_a_stream_that_ends_gives_its_slot_back(store):
    record(store, "done", "fleet-a", turns=1, ended=True)
    app = create_app(settings(api_max_streams=1, api_max_streams_per_token=1), store, live=False)
    with serve(app) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        for _ in range(3):  # each one whole, to session.ended, then the next
            whole = client.get("/api/sessions/done/events", headers=auth("tok-a"))
            assert whole.status_code == 200 and "event: session.ended" in whole.text
        # Refused before its slot: 404 and 204 take none either.
        assert client.get("/api/sessions/nothing/events", headers=auth("tok-a")).status_code == 404
        assert client.get("/api/sessions/done/events", headers={**auth("tok-a"), "Last-Event-ID": "2"}).status_code == 204
        assert client.get("/api/sessions/done/events", headers=auth("tok-a")).status_code == 200


def test_a_follower_that_fell_behind_ends_with_a_cutoff_event_naming_its_last_event(store, monkeypatch):
    record(store, "slow", "fleet-a", turns=2)

    async def fell_behind(fetch, hub, session_id, after_seq, **options) -> AsyncIterator[StoredEvent]:
        assert options["cut_off_when_behind"] is True and options["queue_bytes"] == 64 * 1024
        yield StoredEvent(after_seq + 1, "turn.completed", '{"n": 1}')
        raise FollowerFellBehind(session_id, after_seq + 1)

    monkeypatch.setattr(api_live, "follow_session", fell_behind)
    app = create_app(settings(api_stream_queue_bytes=64 * 1024), store, live=False)
    with TestClient(app) as client:
        body = client.get("/api/sessions/slow/events", headers={**auth("tok-a"), "Last-Event-ID": "0"}).text
    blocks = [block for block in re.split(r"\r\n\r\n|\n\n", body) if block and not block.startswith(":")]
    assert blocks[0].splitlines() == ["id: 1", "event: turn.completed", 'data: {"n": 1}']
    cutoff = blocks[1].splitlines()
    assert cutoff[0] == f"event: {CUTOFF_EVENT}" and not any(line.startswith("id:") for line in cutoff)
    assert msgspec.json.decode(cutoff[1].removeprefix("data: ")) == {"reason": "slow_client", "last_event_id": "1"}
    assert len(blocks) == 2  # the stream ended there


# -- range checks: 4xx, never 500 -------------------------------------------------------
@pytest.mark.parametrize("value", ["-99999999999999999999999999", "99999999999999999999", "9223372036854775808",
                                   "-2", "1_0", "0x10", "1.5", "abc", "9" * 5000])
def test_a_last_event_id_that_is_not_a_seq_is_400(store, value, caplog):
    record(store, "s", "fleet-a", turns=1)
    with TestClient(create_app(settings(), store, live=False), raise_server_exceptions=False) as client:
        answer = client.get("/api/sessions/s/events", headers={**auth("tok-a"), "Last-Event-ID": value})
    assert answer.status_code == 400
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/sessions/s/events", {"after": "-2"}),
        ("/api/sessions/s/events", {"after": str(2**63)}),
        ("/api/sessions/s/events", {"after": "-99999999999999999999999999"}),
        ("/api/sessions", {"limit": "0"}),
        ("/api/sessions", {"limit": "101"}),
        ("/api/sessions", {"limit": "99999999999999999999999"}),
        ("/api/sessions", {"cursor": "x" * (MAX_SESSION_KEY + 1)}),
        ("/api/sessions", {"fleet": "x" * 201}),
        ("/api/sessions", {"include": "everything"}),
        ("/api/sessions/s/transcript", {"limit": "0"}),
        ("/api/sessions/s/transcript", {"limit": "1001"}),
        ("/api/sessions/s/transcript", {"after_turn": "-2"}),
        ("/api/sessions/s/transcript", {"after_turn": str(2**31)}),
        ("/api/fleets/fleet-a/analytics", {"minutes": "0"}),
        ("/api/fleets/fleet-a/analytics", {"minutes": "99999999999999999999"}),
    ],
)
def test_numbers_out_of_range_are_client_errors(store, path, params):
    record(store, "s", "fleet-a", turns=1)
    with TestClient(create_app(settings(), store, live=False), raise_server_exceptions=False) as client:
        answer = client.get(path, headers=auth("tok-a"), params=params)
    assert answer.status_code == 422, answer.text


def test_the_largest_seq_is_accepted_and_means_the_end(store):
    record(store, "s", "fleet-a", turns=1, ended=True)
    with TestClient(create_app(settings(), store, live=False)) as client:
        assert client.get("/api/sessions/s/events", headers=auth("tok-a"), params={"after": 2**63 - 1}).status_code == 204
        at_max = {**auth("tok-a"), "Last-Event-ID": str(2**63 - 1)}
        assert client.get("/api/sessions/s/events", headers=at_max).status_code == 204


# -- pages: rows and bytes -------------------------------------------------------------------
def test_the_session_list_leaves_metadata_out_unless_asked_and_pages_by_bytes(store):
    big = {"notes": "m" * 40_000}  # two of them fit in the smallest page budget (64 KiB), three do not
    ids = [f"meta-{i}" for i in range(5)]
    for session_id in ids:
        record(store, session_id, "fleet-a", metadata=big)
    app = create_app(settings(api_page_bytes=64 * 1024), store, live=False)
    with TestClient(app) as client:
        plain = client.get("/api/sessions", headers=auth("tok-a")).json()
        assert [s["id"] for s in plain["sessions"]] == ids and plain["next_cursor"] is None
        assert all("metadata" not in s for s in plain["sessions"])
        pages, cursor = [], None
        while True:
            params = {"include": "metadata", **({"cursor": cursor} if cursor else {})}
            body = client.get("/api/sessions", headers=auth("tok-a"), params=params).json()
            pages.append([s["id"] for s in body["sessions"]])
            assert all(s["metadata"] == big for s in body["sessions"])
            cursor = body["next_cursor"]
            if cursor is None:
                break
    assert pages == [ids[0:1], ids[1:2], ids[2:3], ids[3:4], ids[4:5]]  # 40 KB + overhead each; 64 KiB fits one


def test_the_default_page_of_sessions_is_20(store):
    for i in range(25):
        record(store, f"many-{i:02d}", "fleet-a")
    with TestClient(create_app(settings(), store, live=False)) as client:
        body = client.get("/api/sessions", headers=auth("tok-a")).json()
    assert len(body["sessions"]) == 20 and body["next_cursor"] == "many-19"


def test_the_transcript_pages_by_count_and_by_bytes(store):
    record(store, "short", "fleet-a", turns=5)
    record(store, "long", "fleet-a", turns=5, text="t" * 30_000)
    app = create_app(settings(api_page_bytes=64 * 1024), store, live=False)
    with TestClient(app) as client:

        def pages(session_id: str, **params) -> list[list[int]]:
            got, after = [], -1
            while True:
                body = client.get(f"/api/sessions/{session_id}/transcript", headers=auth("tok-a"),
                                  params={"after_turn": after, **params}).json()
                got.append([t["turn_index"] for t in body["turns"]])
                assert "metadata" not in body["session"]
                after = body["next_after_turn"]
                if after is None:
                    return got

        assert pages("short", limit=2) == [[0, 1], [2, 3], [4]]
        assert pages("short") == [[0, 1, 2, 3, 4]]
        assert pages("long") == [[0, 1], [2, 3], [4]]  # 30 KB a turn: two fit in 64 KiB
        with_metadata = client.get("/api/sessions/short/transcript", headers=auth("tok-a"),
                                   params={"include": "metadata"}).json()
        assert with_metadata["session"]["metadata"] == {}
        assert client.get("/api/sessions/short/transcript", headers=auth("tok-b")).status_code == 404


# -- docs and headers --------------------------------------------------------------------------
def test_the_api_docs_are_off_unless_turned_on(store):
    with TestClient(create_app(settings(), store, live=False)) as client:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert client.get(path).status_code == 404, path
            assert client.get(path, headers=auth("tok-all")).status_code == 404, path
    with TestClient(create_app(settings(api_docs=True), store, live=False)) as client:
        assert client.get("/openapi.json").json()["info"]["title"] == "turnlog"
        docs = client.get("/docs")
        assert docs.status_code == 200 and docs.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in docs.headers["content-security-policy"]


def test_every_response_carries_the_security_headers(store):
    record(store, "s", "fleet-a", turns=1, ended=True)
    with TestClient(create_app(settings(), store, live=False)) as client:
        answers = {
            "page": client.get("/live"),
            "script": client.get("/live.js"),
            "style": client.get("/live.css"),
            "json": client.get("/api/sessions", headers=auth("tok-a")),
            "refused": client.get("/api/sessions"),
            "missing": client.get("/no/such/path"),
            "stream": client.get("/api/sessions/s/events", headers=auth("tok-a")),
        }
    for name, answer in answers.items():
        assert answer.headers["x-content-type-options"] == "nosniff", name
        assert answer.headers["referrer-policy"] == "no-referrer", name
        assert answer.headers["x-frame-options"] == "DENY", name
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"], name
    page = answers["page"]
    assert page.headers["content-type"].startswith("text/html")
    policy = dict(part.strip().split(" ", 1) for part in page.headers["content-security-policy"].split(";"))
    assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'" and policy["default-src"] == "'none'"
    assert answers["script"].headers["content-type"].startswith("text/javascript")
    assert answers["style"].headers["content-type"].startswith("text/css")
    # The page itself has nothing inline for its CSP to refuse.
    html = page.text
    assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/live.js" defer>']
    assert re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.S) == [""]  # no inline code
    assert "<style" not in html and re.search(r"\son[a-z]+\s*=", html) is None and "style=" not in html



def test_a_store_error_that_is_not_an_outage_is_a_json_500_with_the_security_headers(store, monkeypatch, caplog):
    """A query the database refuses for good (a programming error, as after a bad migration)
    is a 500 like any bug, but answered by the API: JSON, the security headers, and a log line
    naming the error's class, never its SQL or bound values."""
    from sqlalchemy.exc import ProgrammingError

    from turnlog.sinks.access import StoreReads

    class UndefinedTable(Exception):
        sqlstate = "42P01"

    def broken_session(self, session_id, *, fleets, include_metadata=True):
        raise ProgrammingError("SELECT secret_words FROM no_such_table", {"words": "secret_words"}, UndefinedTable())

    monkeypatch.setattr(StoreReads, "session", broken_session)
    app = create_app(settings(), store, live=False, barrier=Barrier())
    with caplog.at_level("ERROR"), TestClient(app, raise_server_exceptions=False) as client:
        answer = client.get("/api/sessions/s-1", headers=auth("tok-a"))
    assert answer.status_code == 500
    assert answer.json() == {"detail": "internal error"}
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert "StoreError" in caplog.text and "secret_words" not in caplog.text
