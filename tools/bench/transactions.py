"""The sequencer's Kafka transactions on and off in the same run (``TURNLOG_SEQUENCER_TRANSACTIONS``).

On, each batch's records of an events partition (transcript and DLQ records, session states)
are written in one transaction, committed per batch per partition
(``stream_processors/transactions.py``); off, one idempotent producer whose emissions are
acknowledged, then the states in a second round trip (``stream_processors/emitter.py``).

Each mode runs as a variant of its own: topics, consumer groups, database and pipeline
(sequencer, sink, finalizer) of its own, on the same workload:

1. **capacity**: the same backlog (``(session id, event bytes)``) is produced to the
   variant's events topic while its pipeline is down; the pipeline then drains it.
   Events/s from the first record the sink applied to the last, counted by the sink's
   ``turnlog_sink_records_total{outcome="applied"}`` (records: the transcript's offsets
   also count the markers that end transactions), and each process's CPU time
   (``/proc/<pid>/stat``) over that span per event applied in it.
2. **moderate load**: the generator (``load.py``, the real recorder) offers about ``rate``
   events/s for ``seconds``. Turn-to-store p50/p95/p99 (``probes.turn_latencies_ms``) once
   the sink has applied every event offered, and each process's CPU from the load's start to
   that moment, per event offered.

Each variant also counts the transactions the sequencer committed to the transcript (the
transcript's offsets less the records applied: one marker per committed transaction), which
checks that the mode asked for is the mode that ran (none off, some on).

Variants alternate off, on, on, off, ... (:func:`variant_order`), so a drift of the shared
machine falls on both modes. Per mode the repetitions are pooled (:func:`pool_runs`): CPU
seconds over events, events over seconds, percentiles over every turn. ``on_over_off``
divides each pooled figure with transactions by the same without (:func:`on_over_off`).

The processes measured: the sequencer, the sink, the finalizer; at moderate load the
generator (this process); and the broker when it is the local one of ``deploy/kafka.sh``
(its pid file under ``TURNLOG_STATE_DIR``), which anything else using that broker adds to.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from turnlog import kafka
from turnlog.deploy.processes import ServiceProcess, start_pipeline, stop_all, wait_all_ready
from turnlog.deploy.topics import create_topics, delete_topics_with_prefix
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.tools.bench import baselines as base
from turnlog.tools.bench.load import plans_for_rate, run_load
from turnlog.tools.bench.probes import cpu_seconds, sink_batches, turn_latencies_ms
from turnlog.tools.bench.workload import SessionPlan

__all__ = ["variant_order", "pool_runs", "on_over_off", "run_transactions", "MODERATE_RATE"]

#: Events/s of the moderate load: where the whole machine already spends ~2.5 ms of CPU per
#: event (small batches), which sets turn-to-store latency.
MODERATE_RATE = 680.0
#: Longest a variant's backlog may take to drain, its first record to be applied, and its moderate
#: load's tail to be applied (seconds).
DRAIN_TIMEOUT_SECONDS = 900.0
FIRST_RECORD_TIMEOUT_SECONDS = 120.0
APPLY_TIMEOUT_SECONDS = 120.0
#: How often the sink's applied records are read while waiting (seconds; each read is one scrape of its /metrics).
POLL_SECONDS = 0.1
_SERVICES = ("sequencer", "sink", "finalizer")


def variant_order(repetitions: int) -> list[bool]:
    """The modes to run, in order (True: transactions on): off, on, then on, off, and so on,
    ``repetitions`` pairs.

    >>> variant_order(2)
    [False, True, True, False]
    """
    order: list[bool] = []
    for repetition in range(repetitions):
        order += [False, True] if repetition % 2 == 0 else [True, False]
    return order


def _per_event_us(cpu: dict[str, float], events: int) -> dict[str, float]:
    return {name: seconds / events * 1e6 if events > 0 else float("nan") for name, seconds in cpu.items()}


def pool_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One mode's figures over its ``runs`` (each as :func:`run_transactions` reports a variant),
    flat, for :func:`on_over_off`:

    - ``capacity_events_per_second``: events applied over seconds, summed over the runs;
    - ``capacity_<process>_us_per_event`` and ``moderate_<process>_us_per_event``: CPU
      microseconds per event, CPU seconds summed over the runs over their events; a process
      some run did not measure (the broker) is left out; ``..._pipeline_us_per_event``: the
      sequencer, sink and finalizer together; ``..._measured_us_per_event``: every process
      measured (the generator and the broker too; Postgres is not measured);
    - ``moderate_offered_events_per_second``: events over the load's seconds;
      ``moderate_p50_ms``, ``_p95_ms``, ``_p99_ms``: turn-to-store, nearest rank over every
      run's turns; ``moderate_complete_turn_p99_ms``
      (the recorder's acknowledgement, which the sequencer's mode does not touch: a control);
    - ``capacity_events_per_transaction``, ``moderate_events_per_transaction``: records the
      sink applied in the phase per transaction the sequencer committed to the transcript
      in it (NaN with none).

    NaN where no run has the figure.
    """
    out: dict[str, Any] = {"runs": len(runs)}
    for phase in ("capacity", "moderate"):
        figures = [run[phase] for run in runs if phase in run]
        events = sum(f["events"] for f in figures)
        seconds = sum(f["seconds"] for f in figures)
        records, transactions = sum(f["records"] for f in figures), sum(f["transactions"] for f in figures)
        if phase == "capacity":
            out["capacity_events_per_second"] = events / seconds if seconds > 0 else float("nan")
        else:  # over the load alone (its CPU span runs on until the last event is applied)
            offered = sum(f["load_seconds"] for f in figures)
            out["moderate_offered_events_per_second"] = events / offered if offered > 0 else float("nan")
        shared = set.intersection(*(set(f["cpu_seconds"]) for f in figures)) if figures else set()
        cpu = {name: sum(f["cpu_seconds"][name] for f in figures) for name in sorted(shared)}
        for name, us in _per_event_us(cpu, events).items():
            out[f"{phase}_{name}_us_per_event"] = us
        services = [out[f"{phase}_{name}_us_per_event"] for name in _SERVICES if name in cpu]
        out[f"{phase}_pipeline_us_per_event"] = sum(services) if len(services) == len(_SERVICES) else float("nan")
        out[f"{phase}_measured_us_per_event"] = sum(_per_event_us(cpu, events).values()) if cpu else float("nan")
        out[f"{phase}_events_per_transaction"] = records / transactions if transactions > 0 else float("nan")
    samples = [ms for run in runs if "moderate" in run for ms in run["moderate"]["samples_ms"]]
    acks = [ms for run in runs if "moderate" in run for ms in run["moderate"]["complete_ms"]]
    for q in (50, 95, 99):
        out[f"moderate_p{q}_ms"] = base.percentile(samples, q)
    out["moderate_turns"] = len(samples)
    out["moderate_complete_turn_p99_ms"] = base.percentile(acks, 99)
    return out


def on_over_off(on: dict[str, Any], off: dict[str, Any]) -> dict[str, float]:
    """Each numeric figure of ``on`` over the same of ``off`` (both from :func:`pool_runs`);
    NaN when either is missing or NaN, or ``off``'s is 0."""
    ratios = {}
    for key, value in on.items():
        if key == "runs" or not isinstance(value, (int, float)):
            continue
        other = off.get(key)
        if other is None or other == 0 or other != other or value != value:  # NaN is not equal to itself
            ratios[key] = float("nan")
        else:
            ratios[key] = value / other
    return ratios


def run_transactions(
    settings: TurnlogSettings,
    *,
    admin_url: SecretStr,
    backlog: Sequence[tuple[str, bytes]],
    plans: list[SessionPlan],
    run: str,
    log_dir: Path,
    repetitions: int = 1,
    rate: float = MODERATE_RATE,
    seconds: float = 30.0,
    speed: float = 10.0,
    flush_interval: float = 0.5,
    ready_timeout: float = 180.0,
    keep: bool = False,
) -> dict[str, Any]:
    """Run ``repetitions`` pairs of variants (module docstring) and pool them per mode.

    ``settings``: the run's settings (open mode); each variant gets its own topic prefix
    (``<topic_prefix>-tx<i><on|off>``), consumer groups, database (``turnlog_bench_<run>_tx<i><on|off>``,
    created with ``admin_url``'s role), Faust and spool folders under ``log_dir``, and the mode.
    ``backlog``: the events every variant drains. ``plans``: the workload whose leading sessions
    offer ``rate`` events/s at ``speed`` for ``seconds``. ``keep``: keep the variants' topics
    and databases.

    Returns ``{"runs": [one per variant], "off": ..., "on": ... (pool_runs), "on_over_off": ...,
    "pairs": [on_over_off of each repetition]}`` and the parameters.

    Raises:
        RuntimeError: a variant's pipeline exited, did not drain or apply in time, or did not
            run in the mode asked.
        ValueError: ``plans`` together offer less than ``rate``.
    """
    chosen = plans_for_rate(plans, rate, speed=speed, flush_interval=flush_interval)
    runs = []
    for index, on in enumerate(variant_order(repetitions)):
        name = f"tx{index}{'on' if on else 'off'}"
        runs.append(_variant(settings, on, name, admin_url=admin_url, backlog=backlog, chosen=chosen, run=run,
                             log_dir=log_dir, seconds=seconds, speed=speed, ready_timeout=ready_timeout, keep=keep))
        cap, mod = runs[-1]["capacity"], runs[-1]["moderate"]
        print(f"transactions {'on ' if on else 'off'} ({name}): capacity {cap['events_per_second']:,.0f} ev/s,"
              f" sequencer {cap['us_per_event']['sequencer']:,.0f} µs/event;"
              f" at {mod['offered_events_per_second']:,.0f} ev/s: turn-to-store p50"
              f" {mod['p50_ms']:.1f} / p95 {mod['p95_ms']:.1f} / p99 {mod['p99_ms']:.1f} ms,"
              f" sequencer {mod['us_per_event']['sequencer']:,.0f} µs/event;"
              f" load average {runs[-1]['load_average'][0]:.2f} -> {runs[-1]['load_average'][1]:.2f}")
    on_runs = [r for r in runs if r["transactions"]]
    off_runs = [r for r in runs if not r["transactions"]]
    pooled_on, pooled_off = pool_runs(on_runs), pool_runs(off_runs)
    # Each repetition's own pair (on_runs[i] and off_runs[i] ran one after the other): the spread.
    pairs = [on_over_off(pool_runs([a]), pool_runs([b])) for a, b in zip(on_runs, off_runs, strict=True)]
    return {
        "repetitions": repetitions,
        "rate_asked_events_per_second": rate,
        "sessions": len(chosen),
        "seconds": seconds,
        "backlog_events": len(backlog),
        "runs": runs,
        "off": pooled_off,
        "on": pooled_on,
        "on_over_off": on_over_off(pooled_on, pooled_off),
        "pairs": pairs,
    }


def _variant(
    settings: TurnlogSettings, on: bool, name: str, *, admin_url: SecretStr, backlog: Sequence[tuple[str, bytes]],
    chosen: list[SessionPlan], run: str, log_dir: Path, seconds: float, speed: float, ready_timeout: float,
    keep: bool,
) -> dict[str, Any]:
    """One variant: its database, topics and pipeline; the drain, then the moderate load."""
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
        sequencer_transactions=on,
    ))
    assert variant.topics.events == f"{prefix}.events", variant.topics.events  # not the run's own topics
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    processes: dict[str, ServiceProcess] = {}
    out: dict[str, Any] = {"name": name, "transactions": on, "load_average": [os.getloadavg()[0]]}
    try:
        engine = open_store(url.render_as_string(hide_password=False)).engine
        upgrade_to_head(engine)
        engine.dispose()
        create_topics(variant)
        base.produce_all(variant, variant.topics.events, backlog)
        port = _free_port()
        env = {"TURNLOG_LOG_LEVEL": "WARNING"}
        processes.update(start_pipeline(variant, log_dir / name, services=("sequencer", "finalizer"), extra_env=env))
        processes.update(start_pipeline(variant, log_dir / name, services=("sink",),
                                        extra_env={**env, "TURNLOG_METRICS_PORT": str(port)}))
        wait_all_ready(processes, ready_timeout)
        broker = _local_broker_pid()
        watched = {service: p.pid for service, p in processes.items()} | ({"broker": broker} if broker else {})

        # -- capacity: drain the backlog --------------------------------------------------------
        first, last = _wait_applied(processes, port, len(backlog), DRAIN_TIMEOUT_SECONDS, watched, start_at_first=True)
        capacity = _figures(first, last, events=last.applied - first.applied, generator=False)
        # The transcript was empty: every offset past the records applied is a transaction's marker.
        capacity["records"] = last.applied
        capacity["transactions"] = _transcript_end(variant) - last.applied
        capacity["events_per_second"] = capacity["events"] / capacity["seconds"] if capacity["seconds"] > 0 else 0.0
        out["capacity"] = capacity

        # -- moderate load ------------------------------------------------------------------------
        ends_before, applied_before = _transcript_end(variant), last.applied
        began = _reading(processes, port, watched)
        load = asyncio.run(run_load(variant, chosen, speed=speed, seconds=seconds, tag=name))
        _, done = _wait_applied(processes, port, applied_before + load.events, APPLY_TIMEOUT_SECONDS, watched)
        moderate = _figures(began, done, events=load.events, generator=True)
        moderate["records"] = done.applied - applied_before
        moderate["transactions"] = _transcript_end(variant) - ends_before - moderate["records"]
        samples = turn_latencies_ms(dsn, f"bench-{run}-%-{name}-")
        moderate.update({
            "offered_events_per_second": load.events_per_second,
            "load_seconds": load.seconds,
            "turns": load.turns,
            "turns_stored": len(samples),
            "p50_ms": base.percentile(samples, 50),
            "p95_ms": base.percentile(samples, 95),
            "p99_ms": base.percentile(samples, 99),
            "complete_turn_p99_ms": base.percentile(load.complete_ms, 99),
            "samples_ms": samples,
            "complete_ms": load.complete_ms,
        })
        out["moderate"] = moderate
        out["load_average"].append(os.getloadavg()[0])
        # The mode asked for is the mode that ran: transactions leave one marker each in the transcript.
        committed = capacity["transactions"] + moderate["transactions"]
        if on != (committed > 0):
            raise RuntimeError(f"variant {name}: asked for transactions {'on' if on else 'off'}, found {committed}"
                               f" transaction markers in {variant.topics.transcript}; see {log_dir / name}")
    finally:
        stop_all(processes)
        if not keep:
            try:
                delete_topics_with_prefix(variant, prefix)
            except Exception as e:  # the broker is away: still drop the database
                print(f"transactions: could not delete the topics {prefix}.* ({e}); delete them by hand")
            with psycopg.connect(admin_dsn, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    return out


@dataclass(frozen=True, slots=True)
class _Reading:
    """One moment: ``at`` (monotonic seconds), the records the sink has applied, and each watched
    process's CPU seconds so far (``generator``: this process)."""

    at: float
    applied: int
    cpu: dict[str, float]


def _reading(processes: dict[str, ServiceProcess], port: int, watched: dict[str, int]) -> _Reading:
    """Raises RuntimeError when a service exited (its log named)."""
    for process in processes.values():
        if not process.alive():
            raise RuntimeError(f"{process.name} exited; see {process.log_path}")
    try:
        applied = int(sink_batches(port).records)
    except (urllib.error.URLError, OSError):  # its metrics server not answering yet
        applied = 0
    times = os.times()
    cpu = {name: cpu_seconds(pid) for name, pid in watched.items()}
    cpu["generator"] = times.user + times.system
    return _Reading(time.monotonic(), applied, cpu)


def _wait_applied(
    processes: dict[str, ServiceProcess], port: int, total: int, timeout: float, watched: dict[str, int], *,
    start_at_first: bool = False,
) -> tuple[_Reading, _Reading]:
    """Poll until the sink has applied ``total`` records; ``(first, last)`` readings, ``first`` the
    first with any record applied when ``start_at_first``, else the first taken.

    Raises:
        RuntimeError: not applied within ``timeout`` seconds, none within
            ``FIRST_RECORD_TIMEOUT_SECONDS``, or a service exited.
    """
    began = time.monotonic()
    deadline = began + timeout
    first: _Reading | None = None
    while True:
        reading = _reading(processes, port, watched)
        if first is None and (reading.applied > 0 or not start_at_first):
            first = reading
        if reading.applied >= total:
            assert first is not None  # set above: total > 0 records are applied
            return first, reading
        if reading.at > deadline or (reading.applied == 0 and reading.at > began + FIRST_RECORD_TIMEOUT_SECONDS):
            logs = Path(processes["sink"].log_path).parent
            raise RuntimeError(f"the sink applied {reading.applied:,} of {total:,} records in"
                               f" {reading.at - began:.0f} s; see the logs in {logs}")
        time.sleep(POLL_SECONDS)


def _figures(first: _Reading, last: _Reading, *, events: int, generator: bool) -> dict[str, Any]:
    """CPU seconds of each process between two readings (the generator's only when it ran then),
    microseconds per event over ``events``, and cores over the span."""
    seconds = last.at - first.at
    cpu = {name: last.cpu[name] - first.cpu[name] for name in first.cpu if generator or name != "generator"}
    return {
        "events": events,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "us_per_event": _per_event_us(cpu, events),
        "cores": {name: used / seconds if seconds > 0 else float("nan") for name, used in cpu.items()},
    }


def _transcript_end(settings: TurnlogSettings) -> int:
    """Sum of the transcript's high watermarks: its records, and the markers of its transactions."""
    with kafka.OffsetReader(settings) as offsets:
        return sum(marks.high for marks in offsets.watermarks(settings.topics.transcript).values())


def _local_broker_pid() -> int | None:
    """The pid of ``deploy/kafka.sh``'s single broker when it runs here (its pid file, its command line
    naming Kafka), else None."""
    state = Path(os.environ.get("TURNLOG_STATE_DIR", Path.home() / ".cache" / "turnlog"))
    try:
        pid = int((state / "kafka" / "kafka.pid").read_text().split()[0])
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return pid if b"kafka.Kafka" in cmdline.read() else None
    except (OSError, ValueError, IndexError):
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
