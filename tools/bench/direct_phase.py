"""Phase 6, the **direct peer** (``direct.py``): each agent upserting its own events straight into
Postgres, its capacity, maximum sustained rate and commits at the latency phase's 50 % session count."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy.engine import make_url

from turnlog.sinks import open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.tools.bench import baselines as base
from turnlog.tools.bench.context import BenchRun, Report
from turnlog.tools.bench.databases import create_database, drop_database
from turnlog.tools.bench.direct import direct_summary, run_direct
from turnlog.tools.bench.load import plans_for_rate
from turnlog.tools.bench.options import BenchOptions
from turnlog.tools.bench.probes import pg_counters, turn_latencies_ms
from turnlog.tools.bench.workload import replayed_keys

__all__ = ["measure_direct"]


def measure_direct(run: BenchRun, report: Report) -> None:
    """The direct peer beside the run's pipeline, at 50 % of M (``run.sustained_rate()``) among others:
    ``direct``."""
    report["direct"] = _direct(run.plans, run.sustained_rate(), run.options, f"{run.database}_direct", run.run_id)


def _direct(plans, sustained: float, options: BenchOptions, database: str, run: str) -> dict[str, Any]:
    """The direct peer (``direct.py``), in a database of its own: only its commits count
    there (``pg_stat_database``), and the pipeline's finalizer never sweeps its sessions.

    Capacity: every plan's agents writing back to back. Maximum sustained: the
    pipeline's search (0.9 of capacity, then 0.8 of the committed rate, up to four
    attempts) with the agents' lateness in place of the pipeline's lag. Then the
    latency phase's 50 % session count: commit latency, and write transactions per
    turn from Postgres's counters, beside the agents' own count.
    """
    import os

    admin = make_url(options.admin_url.get_secret_value())
    url = admin.set(database=database)
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    admin_dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    create_database(admin_dsn, database)
    out: dict[str, Any] = {"connections": options.direct_connections, "phase_seconds": options.phase_seconds}
    try:
        engine = open_store(url.render_as_string(hide_password=False)).engine
        upgrade_to_head(engine)
        engine.dispose()

        def phase(chosen: list, tag: str, paced: bool) -> dict[str, Any]:
            began, cpu_before = time.monotonic(), os.times()
            result = asyncio.run(run_direct(dsn, chosen, speed=options.speed, flush_interval=options.flush_interval,
                                            seconds=options.phase_seconds, tag=tag,
                                            connections=options.direct_connections, paced=paced))
            cpu_after = os.times()
            cpu = cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system
            summary = direct_summary(result, (began + 3, began + options.phase_seconds - 1))
            # The agents' side only (this process): Postgres's own CPU is not counted, as the pipeline's
            # figure leaves out the broker's.
            summary["cpu_us_per_event"] = cpu / result.events * 1e6 if result.events else float("nan")
            summary["cores"] = cpu / result.seconds if result.seconds else float("nan")
            return summary

        capacity = phase(plans, "dc", paced=False)
        for key in ("lateness_slope", "lateness_p99_ms", "flat"):  # no clock to be late against
            capacity.pop(key)
        out["capacity"] = capacity
        print(f"direct capacity: {capacity['committed_events_per_second']:,.0f} events/s committed by {len(plans)}"
              " agents writing back to back"
              f" on {options.direct_connections} connections; this process {capacity['cores']:.2f} cores,"
              f" {capacity['cpu_us_per_event']:,.0f} µs/event")

        rate, attempts = 0.9 * capacity["committed_events_per_second"], []
        for attempt in range(4):
            try:
                chosen, limited = plans_for_rate(plans, rate, speed=options.speed,
                                                 flush_interval=options.flush_interval), False
            except ValueError:  # every plan offers less: the workload, not the design, is the limit
                chosen, limited = plans, True
            summary = phase(chosen, f"ds{attempt}", paced=True)
            attempts.append({"sessions": len(chosen), "offered": summary["events_per_second"],
                             "durable": summary["committed_events_per_second"],
                             "lateness_slope": summary["lateness_slope"], "flat": summary["flat"],
                             "workload_limited": limited})
            print(f"direct sustained attempt {attempt + 1}: {len(chosen)} sessions offered"
                  f" {summary['events_per_second']:,.0f} events/s,"
                  f" committed {summary['committed_events_per_second']:,.0f}/s, lateness slope"
                  f" {summary['lateness_slope']:+.4f} s/s"
                  f" -> {'flat' if summary['flat'] else 'growing'}"
                  + (" (every session of the workload)" if limited else ""))
            if summary["flat"]:
                break
            rate = 0.8 * min(rate, summary["committed_events_per_second"])
        out["sustained"] = {**summary, "attempts": attempts, "workload_limited": limited and summary["flat"]}

        chosen = plans_for_rate(plans, 0.5 * sustained, speed=options.speed, flush_interval=options.flush_interval)
        before = pg_counters(admin_dsn, database)
        summary = phase(chosen, "d50", paced=True)
        time.sleep(1.0)  # the backends report their statistics as they exit
        counters = pg_counters(admin_dsn, database) - before
        stored = turn_latencies_ms(dsn, replayed_keys(run, "d50"))
        turns = max(summary["turns"], 1)
        out["at_50"] = {
            **summary,
            "write_transactions_per_turn": counters.write_transactions / turns,
            "db_commits_per_turn": counters.xact_commit / turns,
            "wal_syncs_per_turn": counters.wal_sync / turns,
            "turn_to_store_p50_ms": base.percentile(stored, 50),
            "turn_to_store_p99_ms": base.percentile(stored, 99),
        }
        a = out["at_50"]
        print(f"direct at 50% ({len(chosen)} sessions, {a['events_per_second']:,.0f} ev/s offered): commit p50"
              f" {a['commit_p50_ms']:.1f} ms,"
              f" p99 {a['commit_p99_ms']:.1f} ms over {a['turns']} turns; write transactions per turn"
              f" {a['write_transactions_per_turn']:.3f}"
              f" (its own count {a['transactions_per_turn']:.3f})")
    finally:
        if not options.keep:
            drop_database(admin_dsn, database)
    return out
