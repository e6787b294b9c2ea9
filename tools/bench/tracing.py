"""Traces (``turnlog/tracing.py``) on and off in the same run: the pipeline's CPU per event and
turn-to-store latency at moderate load, with 10 % of the turns traced and exported.

The pipeline (sequencer, sink, finalizer) and the recorders of the load (``load.py``, in this
process) run with ``TURNLOG_TRACING=on`` and ``TURNLOG_TRACE_SAMPLE_RATIO=0.1``, exporting by
OTLP/HTTP to a receiver that reads each request and discards it (:data:`DISCARD_RECEIVER`, a
process of its own, so its CPU is not counted: a collector runs elsewhere), and without
(``TURNLOG_TRACING=off``). Each mode is a variant of its own (topics, consumer groups, database,
pipeline; ``variants.py``), alternating off, on, on, off, ... The same moderate load is offered
to each: turn-to-store p50/p95/p99, ``complete_turn`` p99, and each process's CPU from the load's
start until the sink has applied every event, per event offered (``generator``: this process,
whose recorder makes the turn spans). A traced variant checks that its spans reached the
receiver; an untraced one, that none did.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from turnlog.deploy.processes import ServiceProcess, start_pipeline, stop_all, wait_all_ready
from turnlog.deploy.topics import create_topics, delete_topics_with_prefix
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.tools.bench.load import plans_for_rate, run_load
from turnlog.tools.bench.probes import turn_latencies_ms
from turnlog.tools.bench.transactions import MODERATE_RATE
from turnlog.tools.bench.variants import (
    APPLY_TIMEOUT_SECONDS,
    free_port,
    latency_figures,
    local_broker_pid,
    on_over_off,
    phase_figures,
    pool_runs,
    take_reading,
    transcript_end,
    variant_order,
    wait_applied,
)
from turnlog.tools.bench.workload import SessionPlan

__all__ = ["run_tracing", "TRACE_SAMPLE_RATIO", "DISCARD_RECEIVER"]

#: The share of turns traced in the traced variants (the issue's "10 % sampled").
TRACE_SAMPLE_RATIO = 0.1
READY_TIMEOUT_SECONDS = 180.0
#: An OTLP/HTTP receiver that answers every POST 200 (an empty ExportTraceServiceResponse) and
#: discards the body; it writes "<requests> <bytes>" to the file argv[2] after each one.
DISCARD_RECEIVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, tally = int(sys.argv[1]), sys.argv[2]
seen = [0, 0]
class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        size = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(min(size, 64 << 20))
        seen[0] += 1
        seen[1] += size
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
        with open(tally, "w") as f:
            f.write(f"{seen[0]} {seen[1]}")
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def run_tracing(
    settings: TurnlogSettings,
    *,
    admin_url: SecretStr,
    plans: list[SessionPlan],
    run: str,
    log_dir: Path,
    repetitions: int = 1,
    rate: float = MODERATE_RATE,
    seconds: float = 30.0,
    speed: float = 10.0,
    flush_interval: float = 0.5,
    ready_timeout: float = READY_TIMEOUT_SECONDS,
    keep: bool = False,
) -> dict[str, Any]:
    """Run ``repetitions`` pairs of variants, tracing off and on (module docstring), and pool them
    per mode. Parameters as ``encryption.run_encryption``'s; each variant's topic prefix is
    ``<topic_prefix>-trc<i><on|off>`` and its database ``turnlog_bench_<run>_trc<i><on|off>``.

    Returns ``{"runs": [...], "off": ..., "on": ..., "on_over_off": ..., "pairs": [...]}`` (the
    ``moderate_*`` figures of ``variants.pool_runs``) and the parameters.

    Raises:
        RuntimeError: a variant's pipeline exited or did not apply the load in time, or a traced
            variant exported nothing (an untraced one something).
        ValueError: ``plans`` together offer less than ``rate``.
    """
    chosen = plans_for_rate(plans, rate, speed=speed, flush_interval=flush_interval)
    runs = []
    for index, on in enumerate(variant_order(repetitions)):
        name = f"trc{index}{'on' if on else 'off'}"
        runs.append(_variant(settings, on, name, admin_url=admin_url, chosen=chosen, run=run, log_dir=log_dir,
                             seconds=seconds, speed=speed, ready_timeout=ready_timeout, keep=keep))
        mod = runs[-1]["moderate"]
        print(f"tracing {'on ' if on else 'off'} ({name}): at {mod['offered_events_per_second']:,.0f} ev/s"
              f" turn-to-store p50 {mod['p50_ms']:.1f} / p99 {mod['p99_ms']:.1f} ms,"
              f" {sum(mod['us_per_event'].values()):,.0f} µs CPU/event (every process measured);"
              f" {runs[-1]['exports']} OTLP requests, {runs[-1]['export_bytes']:,} bytes")
    on_runs = [r for r in runs if r["traced"]]
    off_runs = [r for r in runs if not r["traced"]]
    pooled_on, pooled_off = _moderate(pool_runs(on_runs)), _moderate(pool_runs(off_runs))
    pairs = [on_over_off(_moderate(pool_runs([a])), _moderate(pool_runs([b])))
             for a, b in zip(on_runs, off_runs, strict=True)]
    return {
        "repetitions": repetitions,
        "sample_ratio": TRACE_SAMPLE_RATIO,
        "rate_asked_events_per_second": rate,
        "sessions": len(chosen),
        "seconds": seconds,
        "runs": runs,
        "off": pooled_off,
        "on": pooled_on,
        "on_over_off": on_over_off(pooled_on, pooled_off),
        "pairs": pairs,
    }


def _moderate(pooled: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in pooled.items() if not key.startswith("capacity_")}


def _variant(
    settings: TurnlogSettings, on: bool, name: str, *, admin_url: SecretStr, chosen: list[SessionPlan], run: str,
    log_dir: Path, seconds: float, speed: float, ready_timeout: float, keep: bool,
) -> dict[str, Any]:
    """One variant: its database, topics, receiver (on) and pipeline; the moderate load."""
    admin = make_url(admin_url.get_secret_value())
    database = f"turnlog_bench_{run}_{name}"
    url = admin.set(database=database)
    admin_dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    prefix = f"{settings.topic_prefix}-{name}"
    variant = settings.model_copy(update=dict(
        database_url=SecretStr(url.render_as_string(hide_password=False)),
        topic_prefix=prefix,
        sequencer_group=f"{prefix}-sequencer",
        sink_group=f"{prefix}-sink",
        finalizer_group=f"{prefix}-finalizer",
        faust_data_dir=str(log_dir / name / "faust"),
        spool_dir=str(log_dir / name / "spool"),
        tracing=on,
        trace_sample_ratio=TRACE_SAMPLE_RATIO,
    ))
    assert variant.topics.events == f"{prefix}.events", variant.topics.events  # not the run's own topics
    (log_dir / name).mkdir(parents=True, exist_ok=True)
    tally = log_dir / name / "otlp-received"
    receiver_port = free_port()
    receiver = subprocess.Popen([sys.executable, "-c", DISCARD_RECEIVER, str(receiver_port), str(tally)])
    exporter_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver_port}"}
    saved = {key: os.environ.get(key) for key in exporter_env}
    os.environ.update(exporter_env)  # the load's recorders (this process) export there too
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    processes: dict[str, ServiceProcess] = {}
    out: dict[str, Any] = {"name": name, "traced": on, "load_average": [os.getloadavg()[0]]}
    try:
        engine = open_store(url.render_as_string(hide_password=False)).engine
        upgrade_to_head(engine)
        engine.dispose()
        create_topics(variant)
        port = free_port()
        env = {"TURNLOG_LOG_LEVEL": "WARNING", **exporter_env}
        processes.update(start_pipeline(variant, log_dir / name, services=("sequencer", "finalizer"), extra_env=env))
        processes.update(start_pipeline(variant, log_dir / name, services=("sink",),
                                        extra_env={**env, "TURNLOG_METRICS_PORT": str(port)}))
        wait_all_ready(processes, ready_timeout)
        broker = local_broker_pid()
        watched = {service: p.pid for service, p in processes.items()} | ({"broker": broker} if broker else {})

        ends_before = transcript_end(variant)
        began = take_reading(processes, port, watched)
        load = asyncio.run(run_load(variant, chosen, speed=speed, seconds=seconds, tag=name))
        _, done = wait_applied(processes, port, began.applied + load.events, APPLY_TIMEOUT_SECONDS, watched)
        moderate = phase_figures(began, done, events=load.events, generator=True)
        moderate["records"] = done.applied - began.applied
        moderate["transactions"] = transcript_end(variant) - ends_before - moderate["records"]
        samples = turn_latencies_ms(dsn, f"bench-{run}-%-{name}-")
        moderate.update(latency_figures(load, samples))
        out["moderate"] = moderate
        out["load_average"].append(os.getloadavg()[0])
    finally:
        stop_all(processes)  # a clean stop flushes the services' spans
        out["exports"], out["export_bytes"] = _received(tally, expect_some=on)
        receiver.terminate()
        receiver.wait(10)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if not keep:
            try:
                delete_topics_with_prefix(variant, prefix)
            except Exception as e:  # the broker is away: still drop the database
                print(f"tracing: could not delete the topics {prefix}.* ({e}); delete them by hand")
            with psycopg.connect(admin_dsn, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    if on and not out["exports"]:
        raise RuntimeError(f"variant {name}: tracing on, but no span reached the receiver; see {log_dir / name}")
    if not on and out["exports"]:
        raise RuntimeError(f"variant {name}: tracing off, but {out['exports']} OTLP requests were sent")
    return out


def _received(tally: Path, *, expect_some: bool, wait_seconds: float = 10.0) -> tuple[int, int]:
    """``(requests, bytes)`` the receiver took; with ``expect_some``, waits up to ``wait_seconds``
    for the exporters' last batches (the recorders' were flushed at close, the services' at stop)."""
    deadline = time.monotonic() + (wait_seconds if expect_some else 0.0)
    while True:
        try:
            requests, size = (int(part) for part in tally.read_text().split())
            return requests, size
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return 0, 0
            time.sleep(0.2)
