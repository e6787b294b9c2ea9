"""The operations page's data, ``GET /api/ops`` (turnlog/api/ops.py), over a SQLite store,
a stand-in lag reader and a stand-in Prometheus served over real HTTP: the token rules
(401, 403 for a token scoped to some fleets), the figures' shape, one shared refresh
per interval whatever the number of clients, and a hung or broken source never holding
up the API nor being asked again while it hangs."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgspec
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.testclient import TestClient

from turnlog.api.app import create_app
from turnlog.api.ops import MAX_PROMETHEUS_ANSWER_BYTES, PROMETHEUS_QUERIES, OpsBoard, PrometheusReader
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore
from turnlog.sinks.tables import erasures

from tests.api_server import serve
from tests.support import EventFactory, free_port, messages, sqlite_store, wait_until

TOKENS = {"tok-a": ["fleet-a"], "tok-all": ["*"]}
HANG_SECONDS = 30  # how long a hung stand-in waits for its test to release it
SOURCE_TIMEOUT = 0.5


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    with sqlite_store(tmp_path / "store.db") as store:
        yield store


def record(store: SqlStore, session_id: str, *, ended: bool = False) -> None:
    f = EventFactory(session_id)
    events = [msgspec.structs.replace(f.started(), fleet="fleet-a")]
    if ended:
        events.append(f.ended(1, last_turn=None))
    with store.engine.begin() as conn:
        store.apply_batch(conn, None, messages(events))


@dataclass(frozen=True)
class Lag:
    group: str
    topic: str
    partition: int
    committed: int | None
    end: int
    records: int
    seconds: float


class FakeLag:
    """A lag reader whose answer the test sets; ``hold`` makes reads wait for ``release``."""

    def __init__(self, rows: list[Lag]) -> None:
        self.rows = rows
        self.calls = 0
        self.hold = False
        self.release = threading.Event()
        self.closed = False
        self.unread_groups: tuple[str, ...] = ()

    def read(self, timeout: float) -> list[Lag]:
        self.calls += 1
        if self.hold:
            assert self.release.wait(HANG_SECONDS), "the test never released the lag reader"
        return list(self.rows)

    def close(self) -> None:
        self.closed = True
        self.release.set()


def lag_rows(end: int, behind: int) -> list[Lag]:
    return [
        Lag("seq", "p.events", 0, end - behind, end, behind, 4.5 if behind else 0.0),
        Lag("seq", "p.events", 1, end, end, 0, 0.0),
        Lag("sink", "p.transcript", 0, None, 7, 7, float("nan")),
    ]


def board(store: SqlStore | None, lag: FakeLag | None, prometheus: str | None = None, *,
          refresh: float = 60.0) -> OpsBoard:
    return OpsBoard(lag=(lambda: lag) if lag is not None else None, store=store,
                    prometheus=PrometheusReader(prometheus) if prometheus else None,
                    refresh_seconds=refresh, source_timeout=SOURCE_TIMEOUT)


def app_with(store: SqlStore, ops: OpsBoard) -> FastAPI:
    return create_app(TurnlogSettings(api_tokens=TOKENS), store, live=False, ops=ops)


class FakePrometheus:
    """A Prometheus HTTP API stand-in: answers each of the fixed queries from ``answers``
    (name -> list of (labels, value)); ``mode`` breaks it: hang, http500, huge, malformed."""

    def __init__(self) -> None:
        self.answers: dict[str, list[tuple[dict[str, str], str]]] = {}
        self.mode = "ok"
        self.queries: list[str] = []
        self.release = threading.Event()
        names = {query: name for name, query in PROMETHEUS_QUERIES.items()}
        self.app = FastAPI()

        @self.app.get("/api/v1/query")
        async def query(request: Request) -> Response:
            text = request.query_params["query"]
            self.queries.append(text)
            if self.mode == "hang":
                await asyncio.to_thread(self.release.wait, HANG_SECONDS)
            if self.mode == "http500":
                return JSONResponse({"status": "error"}, status_code=500)
            if self.mode == "huge":
                return Response(b"[" + b"0," * MAX_PROMETHEUS_ANSWER_BYTES + b"0]", media_type="application/json")
            if self.mode == "malformed":
                return JSONResponse({"status": "success", "data": {"resultType": "vector", "result": [{"x": 1}]}})
            result = [{"metric": labels, "value": [1.0, value]} for labels, value in self.answers.get(names[text], [])]
            return JSONResponse({"status": "success", "data": {"resultType": "vector", "result": result}})


@pytest.fixture
def prometheus() -> Iterator[tuple[FakePrometheus, str]]:
    fake = FakePrometheus()
    with serve(fake.app) as url:
        yield fake, url
        fake.release.set()


def test_ops_data_needs_a_token_granting_every_fleet_and_the_page_needs_none(store):
    with TestClient(app_with(store, board(store, FakeLag(lag_rows(10, 0))))) as client:
        assert client.get("/api/ops").status_code == 401
        assert client.get("/api/ops", headers=auth("wrong")).status_code == 401
        refused = client.get("/api/ops", headers=auth("tok-a"))  # valid, but scoped to one fleet
        assert refused.status_code == 403
        assert client.get("/api/ops", headers=auth("tok-all")).status_code == 200
        for path, kind in (("/ops", "text/html"), ("/ops.js", "text/javascript"), ("/ops.css", "text/css")):
            answer = client.get(path)
            assert answer.status_code == 200 and answer.headers["content-type"].startswith(kind)
        # No inline code: the page's script and style are its own files.
        assert "script-src 'self';" in client.get("/ops").headers["content-security-policy"]


def test_ops_figures_shape_lag_sessions_open_and_throughput(store):
    record(store, "open-1")
    record(store, "open-2")
    record(store, "ended-1", ended=True)
    record(store, "forgotten-1")
    with store.engine.begin() as conn:  # a session being forgotten is not counted
        conn.execute(erasures.insert().values(session_id="forgotten-1", fleet="fleet-a", requested_by="test",
                                              requested_at=dt.datetime.now(dt.UTC), reason="request"))
    lag = FakeLag(lag_rows(10, 3))
    with TestClient(app_with(store, board(store, lag, refresh=0.0))) as client:
        first = client.get("/api/ops", headers=auth("tok-all")).json()
        lag.rows = lag_rows(30, 0)  # 20 more records on p.events partition 0, nothing on the transcript
        # A request is answered with the last read while it starts the next one: the change shows soon after.
        second = wait_until(
            lambda: (f := client.get("/api/ops", headers=auth("tok-all")).json())["lag"]["partitions"][0]["records"]
            == 0 and f,
            timeout=HANG_SECONDS, what="a read of the new lag",
        )
    assert first["sessions_open"] == {"state": "ok", "count": 2}
    assert first["lag"]["state"] == "ok" and first["lag"]["omitted"] == 0 and first["lag"]["age_seconds"] >= 0
    assert first["lag"]["partitions"] == [
        {"group": "seq", "topic": "p.events", "partition": 0, "committed": 7, "end": 10, "records": 3, "seconds": 4.5},
        {"group": "seq", "topic": "p.events", "partition": 1, "committed": 10, "end": 10, "records": 0, "seconds": 0.0},
        # not fetched before the deadline: no age, never NaN in the JSON
        {"group": "sink", "topic": "p.transcript", "partition": 0, "committed": None, "end": 7, "records": 7,
         "seconds": None},
    ]
    assert [t["records_per_second"] for t in first["throughput"]["topics"]] == [None, None]  # one read: no rate yet
    rates = {t["topic"]: t for t in second["throughput"]["topics"]}
    assert rates["p.events"]["end_offsets"] == 60 and rates["p.events"]["records_per_second"] > 0
    assert rates["p.transcript"]["records_per_second"] == 0
    assert second["lag"]["partitions"][0]["records"] == 0
    assert first["prometheus"] == {"state": "not_configured"}
    assert isinstance(first["generated_at"], str) and first["refresh_seconds"] == 0.0


async def test_many_clients_share_one_refresh_per_interval(store):
    lag = FakeLag(lag_rows(10, 3))
    lag.hold = True
    with serve(app_with(store, board(store, lag, refresh=60.0))) as url:
        async with httpx.AsyncClient(base_url=url, headers=auth("tok-all"), timeout=HANG_SECONDS) as client:
            asking = [asyncio.create_task(client.get("/api/ops")) for _ in range(20)]
            await asyncio.to_thread(wait_until, lambda: lag.calls >= 1, timeout=HANG_SECONDS, what="the lag read")
            lag.release.set()
            answers = await asyncio.gather(*asking)
            later = (await client.get("/api/ops")).json()
    assert all(a.status_code == 200 for a in answers)
    assert lag.calls == 1  # 21 requests, one read of the lag
    assert later["lag"]["state"] == "ok" and later["lag"]["partitions"][0]["records"] == 3


async def test_a_hung_lag_source_neither_holds_up_the_api_nor_is_asked_again(store):
    lag = FakeLag(lag_rows(10, 3))
    lag.hold = True
    ops = board(store, lag, refresh=0.0)
    with serve(app_with(store, ops)) as url:
        async with httpx.AsyncClient(base_url=url, headers=auth("tok-all"), timeout=HANG_SECONDS) as client:
            first = (await client.get("/api/ops")).json()  # waits for the first read, until its deadline
            second = (await client.get("/api/ops")).json()  # answered at once: the read still hangs
            assert (await client.get("/healthz")).status_code == 200
            calls_while_hung, reads_while_hung = lag.calls, ops.sources["lag"].reads
            lag.release.set()
            await asyncio.to_thread(
                wait_until, lambda: httpx.get(f"{url}/api/ops", headers=auth("tok-all")).json()["lag"]["state"] == "ok",
                timeout=HANG_SECONDS, what="the lag figures once the reader answers",
            )
    for answer in (first, second):
        assert answer["lag"] == {"state": "timeout", "partitions": [], "omitted": 0, "age_seconds": None,
                                 "unread_groups": []}
        assert answer["throughput"]["state"] == "timeout"
        assert answer["sessions_open"] == {"state": "ok", "count": 0}  # the other sources still answer
    assert calls_while_hung == reads_while_hung == 1  # no second read started (nor queued) while the first hangs


def test_prometheus_figures(store, prometheus):
    fake, url = prometheus
    fake.answers = {
        "turn_to_store_p50": [({}, "0.042")],
        "turn_to_store_p99": [({}, "0.31")],
        "turns_stored_per_second": [({}, "12.5")],
        "dlq_last_hour": [({"stage": "sequencer", "reason": "invalid"}, "3"),
                          ({"stage": "sink", "reason": "x" * 500}, "1"), ({"stage": "sink", "reason": "old"}, "0")],
        "degraded_count": [({}, "1")],
        "degraded_instances": [({"instance": "agent-7:9100", "job": "agents", "__name__": "turnlog_recorder_degraded"},
                                "1")],
        "spool_fullness": [({"instance": "agent-7:9100", "job": "agents"}, "0.75"),
                           ({"instance": "agent-8:9100", "job": "agents"}, "+Inf")],
    }
    with TestClient(app_with(store, board(store, None, url))) as client:
        figures = client.get("/api/ops", headers=auth("tok-all")).json()
    prom = figures["prometheus"]
    assert prom["state"] == "ok" and prom["window"] == "5m"
    assert prom["turn_to_store_seconds"] == {"p50": 0.042, "p99": 0.31}
    assert prom["turns_stored_per_second"] == 12.5
    assert prom["dlq_last_hour"] == [{"stage": "sequencer", "reason": "invalid", "records": 3.0},
                                     {"stage": "sink", "reason": "x" * 120, "records": 1.0}]  # cut; zero rows left out
    assert prom["degraded_recorders"] == {"count": 1, "instances": [{"instance": "agent-7:9100", "job": "agents"}]}
    assert prom["spool_fullness"] == [{"instance": "agent-7:9100", "job": "agents", "fullness": 0.75}]
    assert sorted(set(fake.queries)) == sorted(PROMETHEUS_QUERIES.values())  # only the fixed queries
    assert figures["lag"]["state"] == "not_configured"


def test_prometheus_with_no_data_yet_gives_empty_figures(store, prometheus):
    _, url = prometheus
    with TestClient(app_with(store, board(store, None, url))) as client:
        prom = client.get("/api/ops", headers=auth("tok-all")).json()["prometheus"]
    assert prom["state"] == "ok"
    assert prom["turn_to_store_seconds"] == {"p50": None, "p99": None}
    assert prom["degraded_recorders"] == {"count": 0, "instances": []}
    assert prom["dlq_last_hour"] == [] and prom["spool_fullness"] == []


@pytest.mark.parametrize("mode", ["http500", "huge", "malformed"])
def test_a_broken_prometheus_answer_is_unavailable(store, prometheus, mode):
    fake, url = prometheus
    fake.mode = mode
    with TestClient(app_with(store, board(store, FakeLag(lag_rows(10, 0)), url))) as client:
        figures = client.get("/api/ops", headers=auth("tok-all")).json()
    assert figures["prometheus"] == {"state": "unavailable"}
    assert figures["lag"]["state"] == "ok"


def test_prometheus_not_listening_is_unavailable(store):
    with TestClient(app_with(store, board(store, None, f"http://127.0.0.1:{free_port()}"))) as client:
        assert client.get("/api/ops", headers=auth("tok-all")).json()["prometheus"] == {"state": "unavailable"}


async def test_a_hung_prometheus_is_a_timeout_and_each_read_stops_at_its_deadline(store, prometheus):
    fake, prom_url = prometheus
    fake.mode = "hang"
    ops = board(store, FakeLag(lag_rows(10, 0)), prom_url, refresh=0.0)
    with serve(app_with(store, ops)) as url:
        async with httpx.AsyncClient(base_url=url, headers=auth("tok-all"), timeout=HANG_SECONDS) as client:
            answers = [(await client.get("/api/ops")).json() for _ in range(3)]
    assert [a["prometheus"] for a in answers] == [{"state": "timeout"}] * 3
    assert all(a["lag"]["state"] == "ok" for a in answers)
    # The client's own timeout ends each read at its first query: the later queries are never asked,
    # and one read runs at a time.
    reads = ops.sources["prometheus"].reads
    wait_until(lambda: len(fake.queries) >= reads, timeout=HANG_SECONDS, what="the last read's query")
    assert fake.queries == [PROMETHEUS_QUERIES["turn_to_store_p50"]] * reads


def test_prometheus_url_must_be_http():
    with pytest.raises(ValueError, match="ops_prometheus_url"):
        TurnlogSettings(ops_prometheus_url="file:///etc/passwd")
    assert TurnlogSettings(ops_prometheus_url="http://prometheus:9090").ops_prometheus_url == "http://prometheus:9090"


def test_groups_whose_offsets_were_not_read_are_named_and_none_read_is_unavailable_not_no_lag(store):
    lag = FakeLag([])
    lag.unread_groups = ("seq", "sink")  # a broker and store outage: no group's offsets came
    with TestClient(app_with(store, board(store, lag, refresh=0.0))) as client:
        nothing = client.get("/api/ops", headers=auth("tok-all")).json()
        lag.rows, lag.unread_groups = lag_rows(10, 0)[:2], ("sink",)
        some = wait_until(
            lambda: (f := client.get("/api/ops", headers=auth("tok-all")).json())["lag"]["partitions"] and f,
            timeout=HANG_SECONDS, what="a read with rows",
        )
    assert nothing["lag"]["state"] == "unavailable" and nothing["lag"]["unread_groups"] == ["seq", "sink"]
    assert nothing["throughput"]["state"] == "unavailable"
    assert some["lag"]["state"] == "ok" and some["lag"]["unread_groups"] == ["sink"]
    assert {row["group"] for row in some["lag"]["partitions"]} == {"seq"}


def test_the_answer_is_bounded_in_lag_rows(store):
    many = [Lag("g", "t", p, 0, 1, 1, 1.0) for p in range(1100)]
    with TestClient(app_with(store, board(store, FakeLag(many)))) as client:
        lag = client.get("/api/ops", headers=auth("tok-all")).json()["lag"]
    assert len(lag["partitions"]) == 1024 and lag["omitted"] == 76
    assert len(json.dumps(lag)) < 200_000




def test_an_api_whose_store_never_answers_still_exits_after_the_ops_page_was_read():
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import asyncio, socket
        from turnlog.api.ops import OpsBoard
        from turnlog.sinks import open_store
        black_hole = socket.create_server(("127.0.0.1", 0))  # accepts, never speaks; open until the exit
        hung = open_store(f"postgresql+psycopg://turnlog:x@127.0.0.1:{black_hole.getsockname()[1]}/turnlog")
        board = OpsBoard(lag=None, store=hung, prometheus=None, refresh_seconds=1, source_timeout=0.5)
        assert asyncio.run(board.figures())["sessions_open"]["state"] == "timeout"
        board.close()
    """)
    # a liveness bound, not a speed target: a read still waiting on the store must not hold the exit
    done = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
