"""Load on the operations page's data (GET /api/ops) over a real pipeline: many clients
polling at once, with Prometheus answering nothing (a socket that accepts and never
replies). Prints how many reads of each source the board made, how long one read took,
and the answer times of /api/ops and /healthz.

Run from the repository root with the broker up (`bash deploy/services.sh start`):

    python docs/bench/ops_load.py [CLIENTS] [SECONDS]      # default 50 clients, 20 s

The pipeline (sequencer and sink processes) gets its own topics, groups and a SQLite store.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, ".")  # the repository root: the tests' pipeline helpers
from turnlog.api import ops as ops_module  # noqa: E402
from turnlog.api.app import create_app  # noqa: E402
from turnlog.deploy.processes import stop_all  # noqa: E402
from turnlog.producers import SessionRecorder  # noqa: E402

from tests.api_server import serve  # noqa: E402
from tests.integration.conftest import drop_topics, make_pipeline  # noqa: E402

CLIENTS = int(sys.argv[1]) if len(sys.argv) > 1 else 50
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
POLL = 0.25  # each client asks 4 times a second (the page asks every 2 s)
TOKEN = "ops-bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def fill(settings) -> None:
    async with SessionRecorder(settings) as recorder:
        for n in range(20):
            session = await recorder.start_session(f"bench-{n}", fleet="bench", agent_id=f"a{n}")
            for index in range(10):
                await session.complete_turn(index, "user" if index % 2 == 0 else "agent", f"turn {index}")


async def clients(base: str, timings: dict[str, list[tuple[float, float]]]) -> None:
    """Fills ``timings[path]`` with (seconds since the start, answer time) of each request."""
    began_all = time.monotonic()
    deadline = began_all + SECONDS

    async def one(client: httpx.AsyncClient, path: str) -> None:
        while time.monotonic() < deadline:
            began = time.monotonic()
            answer = await client.get(path)
            answer.raise_for_status()
            timings[path].append((began - began_all, time.monotonic() - began))
            await asyncio.sleep(POLL)

    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as client:
        await asyncio.gather(*(one(client, "/api/ops") for _ in range(CLIENTS)), one(client, "/healthz"))


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="turnlog-ops-bench-"))
    pipeline = make_pipeline("127.0.0.1:9092", f"sqlite:///{tmp / 'store.db'}", tmp, ("sequencer", "sink"))
    silent = socket.socket()  # Prometheus that never answers: accepts connections (backlog), replies nothing
    silent.bind(("127.0.0.1", 0))
    silent.listen(512)
    try:
        pipeline.wait_ready()
        asyncio.run(fill(pipeline.settings))
        settings = pipeline.settings.model_copy(update={
            "api_tokens": {TOKEN: ["*"]}, "ops_refresh_seconds": 2.0,
            "ops_prometheus_url": f"http://127.0.0.1:{silent.getsockname()[1]}",
        })
        reads: dict[str, list[float]] = {"lag": [], "store": []}
        original = ops_module.OpsBoard._read_lag, ops_module.OpsBoard._read_sessions

        def timed(name, read):
            def run(self, timeout):
                began = time.monotonic()
                try:
                    return read(self, timeout)
                finally:
                    reads[name].append(time.monotonic() - began)
            return run

        ops_module.OpsBoard._read_lag = timed("lag", original[0])
        ops_module.OpsBoard._read_sessions = timed("store", original[1])
        board = ops_module.OpsBoard.for_settings(settings, pipeline.store)
        timings: dict[str, list[tuple[float, float]]] = {"/api/ops": [], "/healthz": []}
        with serve(create_app(settings, pipeline.store, live=False, ops=board)) as base:
            asyncio.run(clients(base, timings))
            last = httpx.get(f"{base}/api/ops", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        print(f"{CLIENTS} clients polling every {POLL} s for {SECONDS:.0f} s; Prometheus never answers")
        print(f"  reads started per source (one per {settings.ops_refresh_seconds} s at most): "
              + ", ".join(f"{name} {source.reads}" for name, source in board.sources.items()))
        for name, values in reads.items():
            print(f"  {name} reads: {len(values)}, p50 {statistics.median(values) * 1000:.0f} ms, "
                  f"max {max(values) * 1000:.0f} ms")
        # The first requests wait for each source's first read (at most its deadline); later ones never wait.
        first_window = ops_module.OPS_SOURCE_TIMEOUT_SECONDS + ops_module.OPS_SOURCE_GRACE_SECONDS
        for path, samples in timings.items():
            for label, values in (("all", [d for _, d in samples]),
                                  (f"after the first {first_window:g} s", [d for t, d in samples if t > first_window])):
                print(f"  {path} ({label}): {len(values)} answers, p50 {percentile(values, 0.5) * 1000:.1f} ms, "
                      f"p99 {percentile(values, 0.99) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms")
        print(f"  last answer: lag {last['lag']['state']} ({len(last['lag']['partitions'])} rows), "
              f"sessions open {last['sessions_open']['count']}, prometheus {last['prometheus']['state']}")
    finally:
        silent.close()
        stop_all(pipeline.processes)
        pipeline.store.close()
        drop_topics(pipeline.settings)


if __name__ == "__main__":
    main()
