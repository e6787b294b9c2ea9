"""The phases of a full run on its own pipeline: baselines, capacity, sustained, latency, memory.

Each phase is a function ``(run, report) -> None`` (``runner.PHASES``). The capacity phase starts
the pipeline (sequencer, sink, finalizer) and the sampler that every later phase reads, and
measures the capacity C; the sustained phase searches the sustained maximum M from 0.9 C down;
the latency phase offers 50 % and 80 % of M; the timeline phase stops the sampler.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from turnlog.deploy.processes import ServiceProcess, start_pipeline, wait_all_ready
from turnlog.schemas import SessionStarted, TurnPartial, encode_event
from turnlog.schemas.session_keys import session_key
from turnlog.tools.bench import baselines as base
from turnlog.tools.bench.context import PIPELINE_READY_TIMEOUT_SECONDS, BenchRun, Report
from turnlog.tools.bench.histogram import compare as compare_histogram
from turnlog.tools.bench.histogram import scrape_buckets
from turnlog.tools.bench.histogram import summary as histogram_summary
from turnlog.tools.bench.load import plans_for_rate, run_load
from turnlog.tools.bench.options import BenchOptions
from turnlog.tools.bench.probes import (
    Sample,
    Sampler,
    cpu_seconds,
    cpu_us_per_event,
    lag_stats,
    pg_counters,
    rss_bytes,
    sink_batches,
    spool_cost,
    spool_counters,
    turn_latencies_ms,
)
from turnlog.tools.bench.profile import start_profiles, summarize
from turnlog.tools.bench.stages import turn_stage_latencies
from turnlog.tools.bench.workload import BENCH_FLEET, encoded_events, events_per_second, plan_sessions, replayed_keys

__all__ = [
    "measure_baselines",
    "measure_capacity",
    "search_sustained",
    "measure_latency",
    "measure_memory",
    "stop_sampler",
    "cpu_used",
    "wait_drained",
    "FLAT_LAG_SLOPE",
]

#: Lag may grow by at most this share of the offered rate per second and still count as flat.
FLAT_LAG_SLOPE = 0.02


@dataclass
class LoadWindow:
    """The last load a search offered: its span (monotonic seconds), the rates offered and made
    durable, the lag's slope and whether it counts as flat; ``extra``: the search's totals."""

    name: str
    began: float
    ended: float
    offered_events_per_second: float = 0.0
    durable_events_per_second: float = 0.0
    lag_slope: float = 0.0
    flat: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def measure_baselines(run: BenchRun, report: Report) -> None:
    """K, S0, S, P and unsafe on the workload's payloads (``baselines.py``): ``baselines``."""
    settings, options, payloads, dsn = run.settings, run.options, run.payloads, run.dsn
    out: dict[str, Any] = {}
    k = base.kafka_baseline(settings, payloads)
    out["K"] = asdict(k)
    print(f"K  raw Kafka produce->consume: {k.events_per_second:,.0f} events/s, p99 {k.p99_ms:.1f} ms")
    s0 = base.faust_consume_baseline(settings, payloads, run.log_dir)
    out["S0"] = asdict(s0)
    print(f"S0 bare Faust consume-only:    {s0.events_per_second:,.0f} records/s (take_events(1000))")
    s = base.faust_baseline(settings, payloads, run.log_dir)
    out["S"] = asdict(s)
    print(f"S  bare Faust pass-through:    {s.events_per_second:,.0f} events/s")
    methods = base.postgres_baselines(dsn, payloads, batch_size=settings.sink_batch_size)
    out["P"] = [asdict(m) for m in methods]
    for m in methods:
        print(f"P  psycopg {m.method:<22} {m.rows_per_second:,.0f} rows/s, p99 commit {m.p99_commit_ms:.1f} ms")
    best = max(methods, key=lambda m: m.rows_per_second)
    rows_per_event = _rows_per_event(payloads, settings.sink_batch_size)
    out["P_best"] = {"method": best.method, "rows_per_second": best.rows_per_second,
                     "events_per_second": best.rows_per_second / rows_per_event, "rows_per_event": rows_per_event}
    unsafe = base.unsafe_baseline(dsn, options.sessions_dir, turns=options.turns_per_session, speed=20.0)
    out["unsafe"] = asdict(unsafe)
    print(
        f"unsafe (in memory, one write at the end): {unsafe.commits_per_session:.0f} commit per session; "
        f"SIGKILL at 50%: {unsafe.turns_said_at_kill} turns said, {unsafe.turns_stored_after_kill} stored"
    )
    report["baselines"] = out


def _rows_per_event(payloads: list[tuple[str, bytes]], batch_size: int) -> float:
    from turnlog.sinks.batch import plan_batch
    from turnlog.sinks.source_records import SourceMessage

    rows = 0
    for i in range(0, len(payloads), batch_size):
        plan = plan_batch([SourceMessage("b", 0, i + j, v) for j, (_, v) in enumerate(payloads[i : i + batch_size])])
        rows += len(plan.event_rows) + len(plan.turns) + len(plan.sessions)
    return rows / max(len(payloads), 1)


def measure_capacity(run: BenchRun, report: Report) -> None:
    """A backlog drained: ``capacity`` (C), ``cpu_at_capacity`` and, with a profile folder, ``profile``.

    Starts the sampler and the pipeline (``run.sampler``, ``run.processes``) and sets ``run.capacity``.
    """
    settings, options, log_dir, processes = run.settings, run.options, run.log_dir, run.processes
    capacity_plans = plan_sessions(options.sessions_dir, options.sessions, options.turns_per_session,
                                   run_id=f"{run.run_id}c")
    backlog = encoded_events(capacity_plans, flush_interval=options.flush_interval, speed=options.speed)
    base.produce_all(settings, settings.topics.events, backlog)
    sampler = run.sampler = Sampler(settings, run.dsn).start()
    env = {"TURNLOG_LOG_LEVEL": "WARNING"}
    processes.update(start_pipeline(settings, log_dir, services=("sequencer", "finalizer"), extra_env=env))
    processes.update(
        start_pipeline(settings, log_dir, services=("sink",),
                       extra_env={**env, "TURNLOG_METRICS_PORT": str(options.metrics_port)})
    )
    # Their ready files (turnlog/readiness.py): a service that cannot start fails here, naming its log,
    # not after the drain's deadline. The drain is measured from its first stored row either way.
    wait_all_ready(processes, PIPELINE_READY_TIMEOUT_SECONDS)
    capacity = run.capacity = _drain(sampler, len(backlog), options, processes, report)
    print(f"capacity: {capacity:,.0f} durable events/s draining a backlog of {len(backlog):,}")
    report["capacity"] = {"events_per_second": capacity, "backlog_events": len(backlog)}


def _drain(
    sampler: Sampler, total: int, options: BenchOptions, processes: dict[str, ServiceProcess], report: dict[str, Any]
) -> float:
    deadline = time.monotonic() + 900
    profiles = None
    first: Sample | None = None
    services = {name: p for name, p in processes.items() if name in ("sequencer", "sink", "finalizer")}
    cpu_first: dict[str, float] = {}
    while True:
        latest = sampler.samples[-1] if sampler.samples else None
        if latest is not None and latest.stored > 0 and first is None:
            first = latest
            cpu_first = {name: cpu_seconds(p.pid) for name, p in services.items()}
            if options.profile_dir is not None:
                pids = {name: processes[name].pid for name in ("sequencer", "sink")}
                profiles = start_profiles(pids, options.profile_dir, seconds=min(20.0, options.phase_seconds))
        if latest is not None and latest.stored >= total:
            cpu_last = {name: cpu_seconds(p.pid) for name, p in services.items()}
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pipeline did not drain the backlog: {latest}")
        time.sleep(0.1)
    if profiles is not None:
        report["profile"] = {}
        for name, path, spy in profiles:
            spy.wait(60)
            if path.exists():
                summary = summarize(name, path)
                report["profile"][name] = asdict(summary)
    assert first is not None
    report["cpu_at_capacity"] = cpu_us_per_event(cpu_first, cpu_last, latest.stored - first.stored,
                                                 seconds=latest.at - first.at)
    print("CPU per event at capacity: "
          + ", ".join(f"{k} {v:,.0f} µs" for k, v in report["cpu_at_capacity"]["us_per_event"].items())
          + f" (pipeline {report['cpu_at_capacity']['pipeline_us_per_event']:,.0f} µs over"
          f" {latest.stored - first.stored:,} events)")
    return (latest.stored - first.stored) / max(latest.at - first.at, 1e-9)


def search_sustained(run: BenchRun, report: Report) -> None:
    """The sustained maximum M, searched down from 0.9 C (``run.capacity_rate()``), with Postgres's and the
    sink's counters and the recorder's spool cost over the search: ``sustained``. Sets ``run.sustained``."""
    options, admin_psycopg, database, sampler = run.options, run.admin_dsn, run.database, run.running_sampler()
    counters_before = pg_counters(admin_psycopg, database)
    batches_before = sink_batches(options.metrics_port)
    spool_before = spool_counters()
    sustained, phase = _sustained(run.settings, run.plans, sampler, run.capacity_rate(), options, tag="s")
    run.sustained = sustained
    spool = spool_counters() - spool_before
    batches = sink_batches(options.metrics_port) - batches_before
    counters = pg_counters(admin_psycopg, database) - counters_before
    turns_done = phase.extra["turns"]
    report["sustained"] = {
        "events_per_second": sustained,
        "offered_events_per_second": phase.offered_events_per_second,
        "lag_slope_events_per_second": phase.lag_slope,
        "lag_flat": phase.flat,
        "attempts": phase.extra["attempts"],
        "turns": turns_done,
        "sink_commits_per_turn": batches.batches / max(turns_done, 1),
        "write_transactions_per_turn": counters.write_transactions / max(turns_done, 1),
        "all_commits_per_turn": counters.xact_commit / max(turns_done, 1),
        "wal_syncs_per_turn": counters.wal_sync / max(turns_done, 1),
        "sink_batches": batches.batches,
        "sink_batch_seconds": batches.seconds,
        "mean_batch_events": batches.records / max(batches.batches, 1),
        "events_per_turn": phase.extra["events"] / max(turns_done, 1),
        "spool": spool_cost(spool, turns=turns_done, events=phase.extra["events"]),
    }
    figures = report["sustained"]
    figures["mean_batch_turns"] = figures["mean_batch_events"] / figures["events_per_turn"]


def _lag_slope(samples: list[Sample]) -> float:
    """Least-squares slope of lag over time (records per second)."""
    if len(samples) < 3:
        return 0.0
    t0 = samples[0].at
    xs = [s.at - t0 for s in samples]
    ys = [s.lag for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def _sustained(
    settings, plans, sampler: Sampler, capacity: float, options: BenchOptions, *, tag: str
) -> tuple[float, LoadWindow]:
    rate = 0.9 * capacity
    offered = events_per_second(plans, speed=options.speed, flush_interval=options.flush_interval)
    if rate > offered:  # a short run's few sessions (--quick) cannot offer more than this
        print(f"sustained: the workload offers at most {offered:,.0f} events/s, below 0.9 x capacity; starting there")
        rate = offered
    attempts = []
    totals = {"turns": 0, "events": 0}  # over every attempt: the Postgres and sink counters span them all
    for attempt in range(4):
        began = time.monotonic()
        chosen = plans_for_rate(plans, rate, speed=options.speed, flush_interval=options.flush_interval)
        load = asyncio.run(run_load(settings, chosen, speed=options.speed, seconds=options.phase_seconds,
                                    tag=f"{tag}{attempt}"))
        ended = time.monotonic()
        totals["turns"] += load.turns
        totals["events"] += load.events
        # After the ramp-up, before the closing burst (every session ends at the phase's end).
        window = [s for s in sampler.samples if began + 3 <= s.at <= began + options.phase_seconds - 1]
        slope = _lag_slope(window)
        durable = ((window[-1].stored - window[0].stored) / max(window[-1].at - window[0].at, 1e-9)
                   if len(window) > 1 else 0.0)
        flat = slope <= FLAT_LAG_SLOPE * max(load.events_per_second, 1.0)
        attempts.append({"sessions": len(chosen), "offered": load.events_per_second, "durable": durable,
                         "lag_slope": slope, "flat": flat})
        print(f"sustained attempt {attempt + 1}: {len(chosen)} sessions offered {load.events_per_second:,.0f} events/s,"
              f" durable {durable:,.0f}/s, lag slope {slope:+,.1f}/s -> {'flat' if flat else 'growing'}")
        wait_drained(sampler, 300)
        if flat:
            phase = LoadWindow("sustained", began, ended, load.events_per_second, durable, slope, True,
                               {**totals, "attempts": attempts})
            return durable, phase
        rate = 0.8 * min(rate, durable)
    phase = LoadWindow("sustained", began, ended, load.events_per_second, durable, slope, False,
                       {**totals, "attempts": attempts})
    return durable, phase


def measure_latency(run: BenchRun, report: Report) -> None:
    """Turn-to-store latency, commits and cores used at 50 % and 80 % of M (``run.sustained_rate()``):
    ``latency``."""
    settings, options, plans, processes = run.settings, run.options, run.plans, run.processes
    admin_psycopg, database, psycopg_dsn = run.admin_dsn, run.database, run.dsn
    sampler, sustained = run.running_sampler(), run.sustained_rate()
    report["latency"] = {}
    for share in (0.5, 0.8):
        tag = f"l{int(share * 100)}"
        before = pg_counters(admin_psycopg, database)
        batches_before = sink_batches(options.metrics_port)
        histogram_before = scrape_buckets(options.metrics_port)
        chosen = plans_for_rate(plans, share * sustained, speed=options.speed,
                                flush_interval=options.flush_interval)
        cpu_before, wall_before = cpu_used(processes), time.monotonic()
        spool_before = spool_counters()
        load = asyncio.run(run_load(settings, chosen, speed=options.speed, seconds=options.phase_seconds, tag=tag))
        spool = spool_counters() - spool_before
        wall = time.monotonic() - wall_before
        cores = {name: (used - cpu_before[name]) / wall for name, used in cpu_used(processes).items()}
        wait_drained(sampler, 120)
        after = pg_counters(admin_psycopg, database) - before
        phase_batches = sink_batches(options.metrics_port) - batches_before
        stored = scrape_buckets(options.metrics_port) - histogram_before
        keys = replayed_keys(run.run_id, tag)
        mine = turn_latencies_ms(psycopg_dsn, keys)
        stages = turn_stage_latencies(settings, psycopg_dsn, keys).summary()
        report["latency"][f"{int(share * 100)}%"] = {
            "offered_events_per_second": load.events_per_second,
            "turns": len(mine),
            "p50_ms": base.percentile(mine, 50),
            "p95_ms": base.percentile(mine, 95),
            "p99_ms": base.percentile(mine, 99),
            "max_ms": max(mine) if mine else float("nan"),
            "sink_commits_per_turn": phase_batches.batches / max(load.turns, 1),
            "write_transactions_per_turn": after.write_transactions / max(load.turns, 1),
            "all_commits_per_turn": after.xact_commit / max(load.turns, 1),
            "mean_batch_events": phase_batches.records / max(phase_batches.batches, 1),
            "wal_syncs_per_turn": after.wal_sync / max(load.turns, 1),
            "sink_batch_seconds": phase_batches.seconds,
            "spool": spool_cost(spool, turns=load.turns, events=load.events),
            "complete_turn_p50_ms": base.percentile(load.complete_ms, 50),
            "complete_turn_p99_ms": base.percentile(load.complete_ms, 99),
            "lag": lag_stats([s for s in sampler.samples if wall_before + 3 <= s.at <= wall_before + wall],
                             rate=load.events_per_second),
            "cores_used": cores,
            "stages_ms": stages,
            "samples_ms": mine,
            "sink_histogram": compare_histogram(
                stored, {"p50_ms": base.percentile(mine, 50), "p99_ms": base.percentile(mine, 99)}),
        }
        print(f"  cores used at {share:.0%}: " + ", ".join(f"{k} {v:.2f}" for k, v in cores.items()))
        print(f"latency at {share:.0%}: p50 {base.percentile(mine, 50):.1f} ms, p99 {base.percentile(mine, 99):.1f}"
              f" ms over {len(mine)} turns"
              f" at {load.events_per_second:,.0f} ev/s offered; complete_turn p50"
              f" {base.percentile(load.complete_ms, 50):.1f} ms,"
              f" p99 {base.percentile(load.complete_ms, 99):.1f} ms")
        print(f"  {histogram_summary(report['latency'][f'{int(share * 100)}%']['sink_histogram'])}")
        print(f"  stages at {share:.0%} (p50 / p99 ms): " + ", ".join(
            f"{name} {stages[name]['p50']:.1f} / {stages[name]['p99']:.1f}"
            for name in ("spool", "sequence", "store", "total")))


def measure_memory(run: BenchRun, report: Report) -> None:
    """RSS of sequencer and sink before and after opening sessions in steps; growth per 1,000: ``memory``."""
    import datetime as dt

    settings, options, processes, sampler = run.settings, run.options, run.processes, run.running_sampler()
    steps = []
    opened = 0
    for step in range(3):
        if step:
            events = []
            now = dt.datetime.now(dt.UTC)
            for i in range(options.memory_sessions):
                key = session_key(BENCH_FLEET, f"bench-{run.run_id}-open-{opened + i:06d}")
                env: dict[str, Any] = dict(session_id=key, epoch=0, producer_id="bench", emitted_at=now)
                events.append((key,
                               encode_event(SessionStarted(event_id=uuid.uuid4(), seq=0, fleet=BENCH_FLEET,
                                                           agent_id="bench", started_at=now, **env))))
                events.append((key,
                               encode_event(TurnPartial(event_id=uuid.uuid4(), seq=1, turn_index=0, speaker="A",
                                                        text="hello there", started_at=now, **env))))
            base.produce_all(settings, settings.topics.events, events)
            opened += options.memory_sessions
            wait_drained(sampler, 300)
        steps.append({"open_sessions": opened,
                      **{name: rss_bytes(processes[name].pid) for name in ("sequencer", "sink")}})
    per_thousand = {
        name: (steps[-1][name] - steps[0][name]) / max(opened / 1000, 1e-9) / 1e6 for name in ("sequencer", "sink")
    }
    print("memory per 1,000 open sessions: " + ", ".join(f"{k} {v:.2f} MB" for k, v in per_thousand.items()))
    report["memory"] = {"steps": steps, "mb_per_1000_sessions": per_thousand,
                        "total_mb_per_1000_sessions": sum(per_thousand.values())}


def stop_sampler(run: BenchRun, report: Report) -> None:
    """The sampler stopped; every sample it took since the capacity phase: ``timeline``."""
    samples = run.running_sampler().stop()
    report["timeline"] = [asdict(s) for s in samples]


def cpu_used(processes: dict[str, ServiceProcess]) -> dict[str, float]:
    """CPU seconds used so far by each service and by this process (the load generator)."""
    import os

    used = {name: cpu_seconds(p.pid) for name, p in processes.items()}
    times = os.times()
    used["generator (this process)"] = times.user + times.system
    return used


def wait_drained(sampler: Sampler, timeout: float) -> None:
    """Until the pipeline has caught up with what was offered.

    Raises:
        RuntimeError: it has not within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sampler.drained():
            return
        time.sleep(0.2)
    raise RuntimeError(f"the pipeline did not catch up within {timeout:.0f} s")
