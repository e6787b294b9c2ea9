"""Turn-to-store latency at one offered rate, stage by stage, and every process's CPU per event.

Starts the sequencer, sink and finalizer on run-private topics and database,
replays the bench workload (``turnlog.tools.bench``) at about ``RATE`` events/s
for ``SECONDS`` through the real recorder, waits until every completed turn is
stored, and prints:

- turn-to-store p50/p95/p99 (``emitted_at`` -> commit of the row) and the stages
  of ``turnlog.tools.bench.stages`` (spool, sequence, store);
- CPU microseconds per event of every process on the machine that works for the
  pipeline: sequencer, sink, finalizer, this process (the generator: recorder
  and spool), the broker (the JVM) and Postgres (all its processes); and the
  ceiling those imply on two cores (2 / total CPU per event).

Run from the repository root with the broker and Postgres up
(`bash deploy/services.sh start`):

    python docs/bench/latency_probe.py 800 30      # RATE events/s, SECONDS

The pipeline runs as a real deployment does: Kafka transactions, envelope encryption
(``encryption=required``, a keyring of the run's own) and fleet keys (every record signed by
the recorder, verified by the sequencer); ``LAT_SECURITY=off`` runs it open and unencrypted.

``LAT_ENV='{"NAME": "value"}'`` adds environment variables to the services;
``LAT_PROFILE=folder`` samples every service with py-spy during the load
(``<service>.collapsed.txt`` there).
"""
import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from turnlog.deploy.processes import start_pipeline, stop_all, wait_all_ready
from turnlog.deploy.topics import create_topics, delete_topics_with_prefix
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store
from turnlog.tools.bench import baselines as base
from turnlog.tools.bench.encryption import encryption_settings
from turnlog.tools.bench.load import plans_for_rate, run_load
from turnlog.tools.bench.probes import cpu_seconds, turn_latencies_ms
from turnlog.tools.bench.stages import turn_stage_latencies
from turnlog.tools.bench.workload import BENCH_FLEET, plan_sessions, replayed_keys

RATE = float(sys.argv[1]) if len(sys.argv) > 1 else 800.0
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
ADMIN = make_url(os.environ.get("TURNLOG_DATABASE_URL", "postgresql+psycopg://turnlog:turnlog@127.0.0.1:5433/turnlog"))


def pids_of(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def machine_cpu(procs) -> dict[str, float]:
    """CPU seconds so far of each process working for the pipeline (summed per name)."""
    out = {name: cpu_seconds(p.pid) for name, p in procs.items()}
    out["generator"] = cpu_seconds(os.getpid())
    for name, pattern in (("broker", "kafka.Kafka"), ("postgres", "postgres")):
        total = 0.0
        for pid in pids_of(pattern):
            try:
                total += cpu_seconds(pid)
            except OSError:  # a backend that exited meanwhile
                pass
        out[name] = total
    return out


run = uuid.uuid4().hex[:8]
database = f"turnlog_lat_{run}"
sqlalchemy_url = ADMIN.set(database=database).render_as_string(hide_password=False)
psycopg_url = ADMIN.set(database=database, drivername="postgresql").render_as_string(hide_password=False)
admin_url = ADMIN.set(drivername="postgresql").render_as_string(hide_password=False)
with psycopg.connect(admin_url, autocommit=True) as conn:
    conn.execute(f'CREATE DATABASE "{database}"')
log_dir = Path("/tmp/turnlog-latency") / run
settings = TurnlogSettings().model_copy(update=dict(
    database_url=sqlalchemy_url, topic_prefix=f"lat-{run}", sequencer_group=f"lat-{run}-sequencer",
    sink_group=f"lat-{run}-sink", finalizer_group=f"lat-{run}-finalizer", faust_data_dir=str(log_dir / "faust"),
    spool_dir=str(log_dir / "spool"), api_url=None, api_token=None, flush_interval_seconds=0.5, log_level="WARNING",
    insecure_open_fleets=True))  # LAT_SECURITY=off measures open mode; on, the fleet keys below are used
SECURED = os.environ.get("LAT_SECURITY", "on") != "off"
if SECURED:
    settings = encryption_settings(settings.model_copy(update=dict(
        fleet_keys={BENCH_FLEET: SecretStr(secrets.token_urlsafe(32))},
        epoch_grant_key=SecretStr(secrets.token_urlsafe(32)))), True, log_dir / "keyring")
print(f"transactions {'on' if settings.sequencer_transactions else 'off'}, encryption {settings.encryption},"
      f" fleet keys {'on' if settings.fleet_keys else 'off'}")
open_store(sqlalchemy_url).upgrade_schema()
create_topics(settings)
plans = plan_sessions(Path("data/sessions"), 1000, 40, run_id=run)
env = {"TURNLOG_LOG_LEVEL": "WARNING", **json.loads(os.environ.get("LAT_ENV", "{}"))}
procs = start_pipeline(settings, log_dir, extra_env=env)
try:
    wait_all_ready(procs, 180)
    chosen = plans_for_rate(plans, RATE, speed=10.0, flush_interval=0.5)
    cpu_before = machine_cpu(procs)
    profiling = []
    if os.environ.get("LAT_PROFILE"):  # py-spy on every service during the load: collapsed stacks in that folder
        from turnlog.tools.bench.profile import start_profiles
        profiling = start_profiles({n: p.pid for n, p in procs.items()}, Path(os.environ["LAT_PROFILE"]), SECONDS)
    load = asyncio.run(run_load(settings, chosen, speed=10.0, seconds=SECONDS, tag="q"))
    cpu_after = machine_cpu(procs)
    for _name, _path, profiler in profiling:
        profiler.wait()
    print(f"offered {load.events_per_second:,.0f} ev/s, {load.events:,} events, {load.turns:,} turns;"
          f" complete_turn p50 {base.percentile(load.complete_ms, 50):.1f} / p99"
          f" {base.percentile(load.complete_ms, 99):.1f} ms")
    deadline = time.monotonic() + 120
    stored: list[float] = []
    while time.monotonic() < deadline:
        stored = turn_latencies_ms(psycopg_url, replayed_keys(run, "q"))
        if len(stored) >= load.turns:
            break
        time.sleep(1)
    print(f"turn-to-store over {len(stored):,} of {load.turns:,} turns: p50 {base.percentile(stored, 50):.1f},"
          f" p95 {base.percentile(stored, 95):.1f}, p99 {base.percentile(stored, 99):.1f} ms")
    stages = turn_stage_latencies(settings, psycopg_url, replayed_keys(run, "q")).summary()
    print("stages (p50 / p99 ms): " + ", ".join(
        f"{name} {stages[name]['p50']:.1f} / {stages[name]['p99']:.1f}" for name in ("spool", "sequence", "store")))
    # The load phase's CPU; the tail of the drain after it is small at these rates.
    used = {name: cpu_after[name] - cpu_before[name] for name in cpu_before}
    per_event = {name: seconds / max(load.events, 1) * 1e6 for name, seconds in used.items()}
    total = sum(per_event.values())
    print("CPU per event (us): " + ", ".join(f"{name} {us:.0f}" for name, us in per_event.items())
          + f"; all {total:.0f} -> at most {2e6 / total:,.0f} events/s on 2 cores")
finally:
    stop_all(procs)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    delete_topics_with_prefix(settings, settings.topic_prefix)
