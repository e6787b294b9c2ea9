"""``turnlog bench``: the whole benchmark, one run, every figure next to its baseline.

Phases, in order, on a run-private database, topics and consumer groups:

1. **Baselines** K, S0, S, P and unsafe on the workload's payloads (``baselines.py``).
1b. **Transactions** (``transactions.py``): the sequencer with its Kafka transactions on and off
   (``TURNLOG_SEQUENCER_TRANSACTIONS``), each on topics, groups, a database and a pipeline of
   its own, before the run's own pipeline starts: the same backlog drained (events/s, CPU
   per event of each process), then a paced load of about 680 events/s (turn-to-store
   p50/p95/p99, CPU per event); ``transactions_repetitions`` pairs, alternated; on/off
   ratios. ``only="transactions"`` runs this phase alone.
2. **Capacity**: a backlog of the payloads is produced to ``<prefix>.events``
   while the pipeline is down; the pipeline (sequencer, sink, finalizer) then
   drains it. Durable events/s from the first stored record to the last is the
   capacity C. py-spy profiles the sequencer and the sink meanwhile. Each
   service's CPU time (``/proc/<pid>/stat``) over the same span, divided by the
   events stored in it, is its CPU microseconds per event at capacity.
2b. **Signing** (``signing.py``): write-side isolation's CPU per event on and off in
   this process (the recorder's signature; the sequencer's decide path with and
   without verification and admission), and their share of the pipeline's CPU per
   event at capacity. The pipeline phases run in open mode (no fleet keys).
2c. **Redaction** (``redaction.py``): the pattern redactor's CPU per completed turn and per
   partial on the workload's texts, in this process (the recorder runs it in the agent's),
   and its share of the pipeline's CPU per event at capacity. The load runs without it.
2d. **Encryption** (``encryption.py``): envelope encryption's CPU per event on and off in this
   process (the recorder's sealing, a reader's opening with each epoch's first unwrap, the
   sink's planning) and bytes per event; and, before the run's own pipeline starts (beside
   1b), the pipeline with a keyring and sealing recorders and without, each a variant of its
   own, under the same moderate load of about 680 events/s: turn-to-store p50/p95/p99 and
   each process's CPU per event, on/off ratios; ``encryption_repetitions`` pairs, alternated.
   ``only="encryption"`` runs this phase alone. The run's own pipeline phases run as
   configured (``TURNLOG_ENCRYPTION``, ``TURNLOG_KEYRING_FILE``).
2e. **Tracing** (``tracing.py``), ``only="tracing"`` alone (not in a full run): the pipeline and
   the load's recorders with OpenTelemetry traces on (10 % of turns sampled, exported by OTLP to
   a receiver that discards) and off, each a variant of its own under the same moderate load:
   each process's CPU per event and turn-to-store p50/p99, on/off ratios;
   ``tracing_repetitions`` pairs, alternated.
3. **Sustained**: the load generator (``load.py``, the real ``SessionRecorder``)
   offers 0.9 C, then less, until the pipeline's lag stays flat for the whole
   phase; that rate is the sustained maximum M. Postgres commits and WAL syncs
   per completed turn and the sink's mean batch size are taken here.
4. **Latency** at 50 % and 80 % of M: p50/p95/p99 from each completed turn's
   ``emitted_at`` to the commit of its row (``pg_xact_commit_timestamp``).
   The recorder's spool cost (fsyncs and commit time per completed turn, from
   this process's Prometheus registry) is taken in phases 3 and 4.
5. **Resume** at 50 % of M: while the generator offers 0.5 M, sessions are
   recorded and resumed from a new recorder, one after another
   (``resume_probe.py``); p50/p99 of ``resume()``, through the store and
   through ``turnlog api``.
6. **Direct peer** (``direct.py``): the design a user would pick instead, each
   agent upserting its own events straight into Postgres (a database of its
   own), one commit per event. Its capacity (unpaced), its maximum sustained
   rate (the same search as phase 3, lateness instead of lag), and at the
   latency phase's 50 % session count: commit p50/p99 and write transactions
   per turn.
7. **Memory**: resident memory of the sequencer and the sink as open sessions
   are added, per 1,000 open sessions.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr
from sqlalchemy.engine import make_url

from turnlog.deploy.processes import ServiceProcess, start_pipeline, stop_all, wait_all_ready
from turnlog.deploy.topics import create_topics, delete_topics_with_prefix
from turnlog.exceptions import ConfigurationError
from turnlog.schemas import SessionStarted, TurnPartial, encode_event
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.tools.bench import baselines as base
from turnlog.tools.bench.databases import create_database, drop_database
from turnlog.tools.bench.direct import direct_summary, run_direct
from turnlog.tools.bench.encryption import encryption_cost, run_encryption
from turnlog.tools.bench.histogram import compare as compare_histogram
from turnlog.tools.bench.histogram import scrape_buckets
from turnlog.tools.bench.histogram import summary as histogram_summary
from turnlog.tools.bench.load import plans_for_rate, run_load
from turnlog.tools.bench.probes import (
    Sample,
    Sampler,
    cpu_seconds,
    cpu_us_per_event,
    lag_stats,
    pg_counters,
    require_commit_timestamps,
    rss_bytes,
    sink_batches,
    spool_cost,
    spool_counters,
    turn_latencies_ms,
)
from turnlog.tools.bench.profile import start_profiles, summarize
from turnlog.tools.bench.ratios import report_ratios
from turnlog.tools.bench.redaction import redaction_cost
from turnlog.tools.bench.resume_probe import resume_summary, run_probe_process
from turnlog.tools.bench.signing import signing_cost
from turnlog.tools.bench.stages import turn_stage_latencies
from turnlog.tools.bench.table import print_table
from turnlog.tools.bench.tracing import discard_receiver, run_tracing, tracing_cost
from turnlog.tools.bench.transactions import MODERATE_RATE, run_transactions
from turnlog.tools.bench.workload import BENCH_FLEET, encoded_events, events_per_second, plan_sessions

__all__ = ["BenchOptions", "run_bench", "quick_options"]

#: Lag may grow by at most this share of the offered rate per second and still count as flat.
FLAT_LAG_SLOPE = 0.02
#: Longest the pipeline's services may take to write their ready files (seconds).
PIPELINE_READY_TIMEOUT_SECONDS = 180.0


@dataclass(frozen=True)
class BenchOptions:
    sessions_dir: Path
    admin_url: SecretStr  # holds the password: unwrapped only where a connection is made
    sessions: int = 1000
    turns_per_session: int = 40
    phase_seconds: float = 30.0
    flush_interval: float = 0.5
    #: Time compression of the replay; the offered rate is set by how many sessions run.
    speed: float = 10.0
    memory_sessions: int = 5000
    report_path: Path | None = None
    plot_path: Path | None = None
    profile_dir: Path | None = None
    keep: bool = False
    log_dir: Path = Path(".turnlog-bench")
    metrics_port: int = 9464
    #: Resumes per path (store, API) in the resume phase, taken one after another.
    resume_samples: int = 40
    #: Resumes per path with no load first: the same run's idle baseline.
    resume_idle_samples: int = 10
    #: Longest the resume phase's load runs (seconds); resumes start 3 s in, none starts in its
    #: last 5 s, and the load stops once every path has its samples.
    resume_seconds: float = 150.0
    #: Also resume through a ``turnlog api`` started for the phase.
    resume_api: bool = True
    #: Run the direct peer (``direct.py``).
    direct: bool = True
    #: Connections the direct agents share (PgBouncer in transaction mode, as a user would run it).
    direct_connections: int = 16
    #: Pairs of variants (transactions off and on) in the transactions phase; 0 skips it.
    transactions_repetitions: int = 1
    #: Events/s the transactions phase offers under moderate load.
    transactions_rate: float = MODERATE_RATE
    #: Pairs of variants (encryption off and on) in the encryption phase's moderate load; 0 skips it.
    encryption_repetitions: int = 1
    #: Events/s the encryption phase offers (the issue's bound: on within 10 % of off there).
    encryption_rate: float = MODERATE_RATE
    #: Pairs of variants (tracing off and on) in the tracing phase (``only="tracing"``).
    tracing_repetitions: int = 1
    #: Run one phase alone (no baselines, no run-wide pipeline): ``"transactions"``, ``"encryption"`` or
    #: ``"tracing"`` (run only so).
    only: Literal["transactions", "encryption", "tracing"] | None = None


def quick_options(options: BenchOptions) -> BenchOptions:
    """``options`` cut down for a smoke test of every phase (a minute or two, figures
    not comparable with a full run): short phases, 10 turns per session, few resumes,
    small memory steps."""
    from dataclasses import replace

    return replace(
        options,
        turns_per_session=min(options.turns_per_session, 10),
        phase_seconds=min(options.phase_seconds, 8.0),
        memory_sessions=min(options.memory_sessions, 500),
        resume_samples=min(options.resume_samples, 4),
        resume_idle_samples=min(options.resume_idle_samples, 2),
        resume_seconds=min(options.resume_seconds, 30.0),
    )


@dataclass
class Phase:
    name: str
    began: float
    ended: float
    offered_events_per_second: float = 0.0
    durable_events_per_second: float = 0.0
    lag_slope: float = 0.0
    flat: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def require_extras(options: BenchOptions) -> None:
    """Refuse, before any work, a plot or profile the ``bench`` extra's tools are missing for.

    Raises:
        ConfigurationError: ``plot_path`` without matplotlib, ``profile_dir`` without py-spy.
    """
    if options.plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise ConfigurationError("--plot needs matplotlib: pip install 'turnlog[bench]'")
    if options.profile_dir is not None and shutil.which("py-spy") is None:
        raise ConfigurationError("--profile-dir needs py-spy: pip install 'turnlog[bench]'")


def run_bench(settings: TurnlogSettings, options: BenchOptions) -> dict[str, Any]:
    """Run every phase; print the table; return (and write) the report.

    Raises:
        ConfigurationError: a plot or profile is asked for without its tool (:func:`require_extras`).
    """
    require_extras(options)
    run = uuid.uuid4().hex[:8]
    admin = make_url(options.admin_url.get_secret_value())
    database = f"turnlog_bench_{run}"
    dsn_url = admin.set(database=database)
    sqlalchemy_dsn = dsn_url.render_as_string(hide_password=False)
    psycopg_dsn = dsn_url.set(drivername="postgresql").render_as_string(hide_password=False)
    admin_psycopg = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    settings = settings.model_copy(
        update=dict(
            database_url=SecretStr(sqlalchemy_dsn),
            topic_prefix=f"bench-{run}",
            sequencer_group=f"bench-{run}-sequencer",
            sink_group=f"bench-{run}-sink",
            finalizer_group=f"bench-{run}-finalizer",
            faust_data_dir=str(options.log_dir / run / "faust"),
            # A spool folder of the run's own: a recorder adopts every orphaned spool in its
            # folder, and the default (.turnlog-spool) may hold other runs' and tests' spools.
            spool_dir=str(options.log_dir / run / "spool"),
            # Resume through the store unless the resume phase says otherwise.
            api_url=None,
            api_token=None,
            # Open mode: the backlog and the baselines produce unsigned records. Signing's cost is
            # measured on and off in the signing phase instead (tools/bench/signing.py).
            fleet_keys={},
            epoch_grant_key=None,
            flush_interval_seconds=options.flush_interval,
            log_level="WARNING",
        )
    )
    log_dir = options.log_dir / run
    report: dict[str, Any] = {"run_id": run, "options": {k: str(v) for k, v in asdict(options).items()}}
    if options.only is not None:
        return _only_phase(settings, options, report, admin_psycopg)
    create_database(admin_psycopg, database)
    processes: dict[str, ServiceProcess] = {}
    try:
        require_commit_timestamps(psycopg_dsn)
        open_store(sqlalchemy_dsn).upgrade_schema()
        create_topics(settings)
        plans = plan_sessions(options.sessions_dir, options.sessions, options.turns_per_session, run_id=run)
        payloads = encoded_events(plans, flush_interval=options.flush_interval, speed=options.speed)
        print(f"turnlog bench {run}: {len(plans)} sessions x {options.turns_per_session} turns = {len(payloads):,}"
              " events per pass")

        report["baselines"] = _baselines(settings, options, payloads, psycopg_dsn, log_dir)

        # -- transactions on and off, before the run's own pipeline starts -------------------
        if options.transactions_repetitions > 0:
            try:
                report["transactions"] = _transactions(settings, options, plans, payloads, run, log_dir)
            except Exception as e:  # the other figures still stand
                report["transactions"] = {"error": f"{type(e).__name__}: {e}"}
                print(f"transactions phase failed: {report['transactions']['error']}")

        # -- encryption on and off under load, on pipelines of its own (its cost per event: below) ----
        if options.encryption_repetitions > 0:
            try:
                report["encryption"] = _encryption(settings, options, plans, run, log_dir)
            except Exception as e:  # the other figures still stand
                report["encryption"] = {"error": f"{type(e).__name__}: {e}"}
                print(f"encryption phase failed: {report['encryption']['error']}")

        # -- capacity: drain a backlog ------------------------------------------------
        capacity_plans = plan_sessions(options.sessions_dir, options.sessions, options.turns_per_session,
                                       run_id=f"{run}c")
        backlog = encoded_events(capacity_plans, flush_interval=options.flush_interval, speed=options.speed)
        base.produce_all(settings, settings.topics.events, backlog)
        sampler = Sampler(settings, psycopg_dsn).start()
        env = {"TURNLOG_LOG_LEVEL": "WARNING"}
        processes.update(start_pipeline(settings, log_dir, services=("sequencer", "finalizer"), extra_env=env))
        processes.update(
            start_pipeline(settings, log_dir, services=("sink",),
                           extra_env={**env, "TURNLOG_METRICS_PORT": str(options.metrics_port)})
        )
        # Their ready files (turnlog/readiness.py): a service that cannot start fails here, naming its log,
        # not after the drain's deadline. The drain is measured from its first stored row either way.
        wait_all_ready(processes, PIPELINE_READY_TIMEOUT_SECONDS)
        capacity = _drain(sampler, len(backlog), options, processes, report)
        print(f"capacity: {capacity:,.0f} durable events/s draining a backlog of {len(backlog):,}")
        report["capacity"] = {"events_per_second": capacity, "backlog_events": len(backlog)}

        # -- signing: write-side isolation's CPU per event, on and off ---------------------
        report["signing"] = _signing(payloads, report)
        report["redaction"] = _redaction(payloads, report)
        report["encryption_cost"] = _encryption_cost(payloads, report)

        # -- sustained ---------------------------------------------------------------------
        counters_before = pg_counters(admin_psycopg, database)
        batches_before = sink_batches(options.metrics_port)
        spool_before = spool_counters()
        sustained, phase = _sustained(settings, plans, sampler, capacity, options, tag="s")
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

        # -- latency at 50 % and 80 % ----------------------------------------------------------
        report["latency"] = {}
        for share in (0.5, 0.8):
            tag = f"l{int(share * 100)}"
            before = pg_counters(admin_psycopg, database)
            batches_before = sink_batches(options.metrics_port)
            histogram_before = scrape_buckets(options.metrics_port)
            chosen = plans_for_rate(plans, share * sustained, speed=options.speed,
                                    flush_interval=options.flush_interval)
            cpu_before, wall_before = _cpu(processes), time.monotonic()
            spool_before = spool_counters()
            load = asyncio.run(run_load(settings, chosen, speed=options.speed, seconds=options.phase_seconds, tag=tag))
            spool = spool_counters() - spool_before
            wall = time.monotonic() - wall_before
            cores = {name: (used - cpu_before[name]) / wall for name, used in _cpu(processes).items()}
            _wait_drained(sampler, 120)
            after = pg_counters(admin_psycopg, database) - before
            phase_batches = sink_batches(options.metrics_port) - batches_before
            stored = scrape_buckets(options.metrics_port) - histogram_before
            mine = turn_latencies_ms(psycopg_dsn, f"bench-{run}-%-{tag}-")
            stages = turn_stage_latencies(settings, psycopg_dsn, f"bench-{run}-%-{tag}-").summary()
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

        # -- resume at 50 % ---------------------------------------------------------------------------
        try:
            report["resume"] = _resume(settings, plans, sustained, sampler, options, processes, log_dir, run)
        except Exception as e:  # the other figures still stand
            report["resume"] = {"error": f"{type(e).__name__}: {e}"}
            print(f"resume phase failed: {report['resume']['error']}")
            _wait_drained(sampler, 300)

        # -- the direct peer ----------------------------------------------------------------------------
        if options.direct:
            try:
                report["direct"] = _direct(plans, sustained, options, f"{database}_direct", run)
            except Exception as e:  # the pipeline's figures still stand
                report["direct"] = {"error": f"{type(e).__name__}: {e}"}
                print(f"direct phase failed: {report['direct']['error']}")

        # -- memory per 1,000 open sessions ---------------------------------------------------------
        report["memory"] = _memory(settings, processes, sampler, options, run)
        samples = sampler.stop()
        report["timeline"] = [asdict(s) for s in samples]
        report["ratios"] = report_ratios(report)
    finally:
        stop_all(processes)
        if not options.keep:  # the run's topics, Faust's changelog and internal topics included
            try:
                delete_topics_with_prefix(settings, settings.topic_prefix)
            except Exception as e:  # the broker is away: still drop the database
                print(f"turnlog bench {run}: could not delete the topics {settings.topic_prefix}.* ({e}); delete"
                      " them by hand")
            drop_database(admin_psycopg, database)
    return _finish(report, options)


def _finish(report: dict[str, Any], options: BenchOptions) -> dict[str, Any]:
    """Print the table; write the report and the plot (the plot only with a timeline); return the report."""
    print_table(report)
    if options.report_path is not None:
        slim = {k: v for k, v in report.items() if k != "timeline"}
        options.report_path.write_text(json.dumps({**slim, "timeline": report.get("timeline", [])}, indent=2,
                                                  default=str))
        print(f"report written to {options.report_path}")
    if options.plot_path is not None and "timeline" in report:
        from turnlog.tools.bench.plot import plot_report

        plot_report(report, options.plot_path)
        print(f"plot written to {options.plot_path}")
    return report


def _only_phase(
    settings: TurnlogSettings, options: BenchOptions, report: dict[str, Any], admin_dsn: str
) -> dict[str, Any]:
    """One phase alone (``options.only``: transactions or encryption): its variants make their own
    databases and topics, so the run makes none of its own."""
    run = report["run_id"]
    require_commit_timestamps(admin_dsn)
    plans = plan_sessions(options.sessions_dir, options.sessions, options.turns_per_session, run_id=run)
    payloads = encoded_events(plans, flush_interval=options.flush_interval, speed=options.speed)
    print(f"turnlog bench {run}, {options.only} only: {len(plans)} sessions x {options.turns_per_session} turns ="
          f" {len(payloads):,} events per pass")
    if options.only == "transactions":
        report["transactions"] = _transactions(settings, options, plans, payloads, run, options.log_dir / run)
    elif options.only == "tracing":
        report["tracing_cost"] = _tracing_cost(payloads, options.log_dir / run)
        report["tracing"] = _tracing(settings, options, plans, run, options.log_dir / run)
    else:
        report["encryption_cost"] = _encryption_cost(payloads, report)
        report["encryption"] = _encryption(settings, options, plans, run, options.log_dir / run)
    return _finish(report, options)


def _transactions(
    settings: TurnlogSettings, options: BenchOptions, plans, payloads: list[tuple[str, bytes]], run: str,
    log_dir: Path,
) -> dict[str, Any]:
    """The sequencer's transactions on and off (``transactions.py``): ``payloads`` is the backlog each
    variant drains, ``plans`` the workload of the moderate load."""
    result = run_transactions(
        settings, admin_url=options.admin_url, backlog=payloads, plans=plans, run=run, log_dir=log_dir,
        repetitions=max(options.transactions_repetitions, 1),
        rate=options.transactions_rate, seconds=options.phase_seconds, speed=options.speed,
        flush_interval=options.flush_interval, ready_timeout=PIPELINE_READY_TIMEOUT_SECONDS, keep=options.keep,
    )
    r, nan = result["on_over_off"], float("nan")
    print(f"transactions on/off ({result['repetitions']} x each, pooled): capacity"
          f" {r.get('capacity_events_per_second', nan):.2f} x, sequencer CPU/event at capacity"
          f" {r.get('capacity_sequencer_us_per_event', nan):.2f} x; at"
          f" {result['on']['moderate_offered_events_per_second']:,.0f} ev/s: sequencer CPU/event"
          f" {r.get('moderate_sequencer_us_per_event', nan):.2f} x, turn-to-store p50"
          f" {r.get('moderate_p50_ms', nan):.2f} x, p99 {r.get('moderate_p99_ms', nan):.2f} x")
    return result


def _encryption(
    settings: TurnlogSettings, options: BenchOptions, plans, run: str, log_dir: Path
) -> dict[str, Any]:
    """The pipeline with encryption on and off under the same moderate load (``encryption.py``)."""
    result = run_encryption(
        settings, admin_url=options.admin_url, plans=plans, run=run, log_dir=log_dir,
        repetitions=max(options.encryption_repetitions, 1), rate=options.encryption_rate,
        seconds=options.phase_seconds, speed=options.speed, flush_interval=options.flush_interval,
        ready_timeout=PIPELINE_READY_TIMEOUT_SECONDS, keep=options.keep,
    )
    r, nan = result["on_over_off"], float("nan")
    print(f"encryption on/off ({result['repetitions']} x each, pooled) at"
          f" {result['on']['moderate_offered_events_per_second']:,.0f} ev/s: turn-to-store p99"
          f" {r.get('moderate_p99_ms', nan):.2f} x, p50 {r.get('moderate_p50_ms', nan):.2f} x; CPU per event of every"
          f" process measured {r.get('moderate_measured_us_per_event', nan):.2f} x, of the pipeline"
          f" {r.get('moderate_pipeline_us_per_event', nan):.2f} x")
    return result


def _tracing_cost(payloads: list[tuple[str, bytes]], log_dir: Path) -> dict[str, Any]:
    """Tracing's CPU per event in this process, off and on, stage by stage (``tracing.py``, part 1)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with discard_receiver(log_dir / "otlp-received-cost") as endpoint:
        cost = tracing_cost(payloads, endpoint=endpoint)
    print(f"tracing ({cost['sample_ratio']:.0%} sampled), in process: recorder {cost['recorder_off_us']:.1f} ->"
          f" {cost['recorder_on_us']:.1f} µs/event, sequencer {cost['sequencer_off_us']:.1f} ->"
          f" {cost['sequencer_on_us']:.1f}, sink {cost['sink_off_us']:.1f} -> {cost['sink_on_us']:.1f};"
          f" together {cost['total_on_over_off']:.3f} x ({cost['traced_records']:,} of {cost['events']:,} records"
          " traced)")
    return cost


def _tracing(settings: TurnlogSettings, options: BenchOptions, plans, run: str, log_dir: Path) -> dict[str, Any]:
    """The pipeline with traces on (10 % sampled) and off under the same moderate load (``tracing.py``)."""
    result = run_tracing(
        settings, admin_url=options.admin_url, plans=plans, run=run, log_dir=log_dir,
        repetitions=max(options.tracing_repetitions, 1), rate=options.encryption_rate,
        seconds=options.phase_seconds, speed=options.speed, flush_interval=options.flush_interval,
        ready_timeout=PIPELINE_READY_TIMEOUT_SECONDS, keep=options.keep,
    )
    r, nan = result["on_over_off"], float("nan")
    print(f"tracing on/off ({result['repetitions']} x each, pooled, {result['sample_ratio']:.0%} sampled) at"
          f" {result['on']['moderate_offered_events_per_second']:,.0f} ev/s: CPU per event of every process measured"
          f" {r.get('moderate_measured_us_per_event', nan):.3f} x, of the pipeline"
          f" {r.get('moderate_pipeline_us_per_event', nan):.3f} x, of the recorder (generator)"
          f" {r.get('moderate_generator_us_per_event', nan):.3f} x; turn-to-store p99"
          f" {r.get('moderate_p99_ms', nan):.2f} x, p50 {r.get('moderate_p50_ms', nan):.2f} x")
    return result


def _baselines(
    settings: TurnlogSettings, options: BenchOptions, payloads: list[tuple[str, bytes]], dsn: str, log_dir: Path
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    k = base.kafka_baseline(settings, payloads)
    out["K"] = asdict(k)
    print(f"K  raw Kafka produce->consume: {k.events_per_second:,.0f} events/s, p99 {k.p99_ms:.1f} ms")
    s0 = base.faust_consume_baseline(settings, payloads, log_dir)
    out["S0"] = asdict(s0)
    print(f"S0 bare Faust consume-only:    {s0.events_per_second:,.0f} records/s (take_events(1000))")
    s = base.faust_baseline(settings, payloads, log_dir)
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
    return out


def _cpu(processes: dict[str, ServiceProcess]) -> dict[str, float]:
    """CPU seconds used so far by each service and by this process (the load generator)."""
    import os

    used = {name: cpu_seconds(p.pid) for name, p in processes.items()}
    times = os.times()
    used["generator (this process)"] = times.user + times.system
    return used


def _resume(
    settings: TurnlogSettings, plans, sustained: float, sampler: Sampler, options: BenchOptions,
    processes: dict[str, ServiceProcess], log_dir: Path, run: str,
) -> dict[str, Any]:
    """Resume latency while the generator offers half the sustained rate (``resume_probe.py``),
    with the pipeline's lag and the cores each process used meanwhile."""
    import os

    from pydantic import SecretStr

    probe_settings, api_url = settings, None
    out: dict[str, Any] = {}
    api: ServiceProcess | None = None
    if options.resume_api:
        token, port = f"bench-{run}-resume", _free_port()
        try:
            api = start_pipeline(
                settings.model_copy(update={"api_tokens": {token: [BENCH_FLEET]}, "api_port": port}),
                log_dir, services=("api",), extra_env={"TURNLOG_LOG_LEVEL": "WARNING"},
            )["api"]
            api.wait_ready(60)  # its ready file: the transcript hub follows the topic
            _wait_http(f"http://127.0.0.1:{port}/healthz", 60, api)  # and the port answers
            probe_settings, api_url = settings.model_copy(update={"api_token": SecretStr(token)}), f"http://127.0.0.1:{port}"
        except Exception as e:  # the store path is still measured
            out["api_error"] = f"{type(e).__name__}: {e}"
            print(f"resume: turnlog api did not start ({out['api_error']}); measuring the store path only")
    try:
        probe_log = log_dir / "resume-probe.log"
        # The same run's baseline: resumes with no load (the pipeline idle).
        now = time.monotonic()
        idle = asyncio.run(run_probe_process(probe_settings, api_url=api_url, begin_at=now, end_at=now + 120,
                                             samples=options.resume_idle_samples, tag="resume-idle",
                                             log_path=probe_log))
        chosen = plans_for_rate(plans, 0.5 * sustained, speed=options.speed, flush_interval=options.flush_interval)

        window: dict[str, float] = {}

        async def phase() -> tuple[Any, Any]:
            began, stop = time.monotonic(), asyncio.Event()
            window["began"] = began

            async def probe() -> Any:
                try:
                    return await run_probe_process(probe_settings, api_url=api_url, begin_at=began + 3,
                                                   end_at=began + options.resume_seconds - 5,
                                                   samples=options.resume_samples,
                                                   tag="resume", log_path=probe_log)
                finally:
                    stop.set()  # the load ends with the probe

            outcomes = await asyncio.gather(
                run_load(settings, chosen, speed=options.speed, seconds=options.resume_seconds, tag="r50", stop=stop),
                probe(),
                return_exceptions=True,  # a failed probe stops the load, which then ends its sessions
            )
            load, probes = outcomes  # unpacked apart: mypy cannot type it unpacked from the await
            window["ended"] = time.monotonic()
            for outcome in (load, probes):
                if isinstance(outcome, BaseException):
                    raise outcome
            return load, probes

        watched = {**processes, **({"api": api} if api is not None else {})}
        cpu_before, children_before = _cpu(watched), os.times()
        load, probes = asyncio.run(phase())
        children = os.times()
        wall = window["ended"] - window["began"]
        cores = {name: (used - cpu_before[name]) / wall for name, used in _cpu(watched).items()}
        # The probe is the one child process waited for in the phase (the API is stopped after it).
        cores["resume probe"] = (children.children_user + children.children_system
                                 - children_before.children_user - children_before.children_system) / wall
    finally:
        if api is not None:
            api.stop()
    _wait_drained(sampler, 300)
    out["offered_events_per_second"] = load.events_per_second
    out["share_of_sustained"] = load.events_per_second / max(sustained, 1e-9)
    out["seconds"] = load.seconds
    out["turns"] = load.turns
    out["cores_used"] = cores
    # The pipeline's lag while resumes ran (after the load's first 3 s): what a barrier waits behind.
    out["lag"] = lag_stats([s for s in sampler.samples if window["began"] + 3 <= s.at <= window["ended"]],
                           rate=load.events_per_second)
    out["complete_turn_p50_ms"] = base.percentile(load.complete_ms, 50)
    out["complete_turn_p99_ms"] = base.percentile(load.complete_ms, 99)
    print(f"resume phase load: {load.events_per_second:,.0f} ev/s offered over {load.seconds:.0f} s "
          f"({out['share_of_sustained']:.2f} of sustained); complete_turn p50 {out['complete_turn_p50_ms']:.1f} ms, "
          f"p99 {out['complete_turn_p99_ms']:.1f} ms; lag mean {out['lag']['records']['mean']:,.0f} records "
          f"(sequencer {out['lag']['sequencer_records']['mean']:,.0f}, sink"
          f" {out['lag']['sink_records']['mean']:,.0f}), "
          f"p99 {out['lag']['records']['p99']:,.0f}; cores: " + ", ".join(f"{k} {v:.2f}" for k, v in cores.items()))
    out["idle"] = {}
    for name, samples in idle.items():
        out["idle"][name] = {**resume_summary(samples.samples_ms, stale=samples.stale),
                             "failures": samples.failures[:10]}
    for name, samples in probes.items():
        out[name] = {**resume_summary(samples.samples_ms, stale=samples.stale), "failures": samples.failures[:10]}
        r, i = out[name], out["idle"][name]
        print(f"resume via {name} at 50%: p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms over"
              f" {r['samples']} resumes"
              f" ({r['failed']} failed, {r['stale']} stale) at {load.events_per_second:,.0f} ev/s offered;"
              f" idle: p50 {i['p50_ms']:.0f} ms, p99 {i['p99_ms']:.0f} ms over {i['samples']}")
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float, process: ServiceProcess) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if not process.alive():
            raise RuntimeError(f"it exited; see {process.log_path}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {timeout:.0f} s; see {process.log_path}")
        time.sleep(0.2)


def _rows_per_event(payloads: list[tuple[str, bytes]], batch_size: int) -> float:
    from turnlog.sinks.batch import plan_batch
    from turnlog.sinks.source_records import SourceMessage

    rows = 0
    for i in range(0, len(payloads), batch_size):
        plan = plan_batch([SourceMessage("b", 0, i + j, v) for j, (_, v) in enumerate(payloads[i : i + batch_size])])
        rows += len(plan.event_rows) + len(plan.turns) + len(plan.sessions)
    return rows / max(len(payloads), 1)


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


def _wait_drained(sampler: Sampler, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sampler.drained():
            return
        time.sleep(0.2)
    raise RuntimeError(f"the pipeline did not catch up within {timeout:.0f} s")


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
) -> tuple[float, Phase]:
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
        _wait_drained(sampler, 300)
        if flat:
            phase = Phase("sustained", began, ended, load.events_per_second, durable, slope, True,
                          {**totals, "attempts": attempts})
            return durable, phase
        rate = 0.8 * min(rate, durable)
    phase = Phase("sustained", began, ended, load.events_per_second, durable, slope, False,
                  {**totals, "attempts": attempts})
    return durable, phase


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
        stored = turn_latencies_ms(dsn, f"bench-{run}-%-d50-")
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


def _memory(
    settings: TurnlogSettings, processes: dict[str, ServiceProcess], sampler: Sampler, options: BenchOptions, run: str
) -> dict[str, Any]:
    """RSS of sequencer and sink before and after opening sessions in steps; growth per 1,000."""
    import datetime as dt

    steps = []
    opened = 0
    for step in range(3):
        if step:
            events = []
            now = dt.datetime.now(dt.UTC)
            for i in range(options.memory_sessions):
                sid = f"bench-{run}-open-{opened + i:06d}"
                env: dict[str, Any] = dict(session_id=sid, epoch=0, producer_id="bench", emitted_at=now)
                events.append((sid,
                               encode_event(SessionStarted(event_id=uuid.uuid4(), seq=0, fleet="bench",
                                                           agent_id="bench", started_at=now, **env))))
                events.append((sid,
                               encode_event(TurnPartial(event_id=uuid.uuid4(), seq=1, turn_index=0, speaker="A",
                                                        text="hello there", started_at=now, **env))))
            base.produce_all(settings, settings.topics.events, events)
            opened += options.memory_sessions
            _wait_drained(sampler, 300)
        steps.append({"open_sessions": opened,
                      **{name: rss_bytes(processes[name].pid) for name in ("sequencer", "sink")}})
    per_thousand = {
        name: (steps[-1][name] - steps[0][name]) / max(opened / 1000, 1e-9) / 1e6 for name in ("sequencer", "sink")
    }
    print("memory per 1,000 open sessions: " + ", ".join(f"{k} {v:.2f} MB" for k, v in per_thousand.items()))
    return {"steps": steps, "mb_per_1000_sessions": per_thousand,
            "total_mb_per_1000_sessions": sum(per_thousand.values())}


def _signing(payloads: list[tuple[str, bytes]], report: dict[str, Any]) -> dict[str, Any]:
    """Signing's CPU per event on and off (``signing.py``), and its share of the pipeline's CPU per
    event at capacity measured in this run."""
    cost = signing_cost(payloads)
    added = cost["recorder_sign_us"] + cost["sequencer_on_us"] - cost["sequencer_off_us"]
    pipeline = report.get("cpu_at_capacity", {}).get("pipeline_us_per_event", float("nan"))
    cost["added_us_per_event"] = added
    cost["added_share_of_pipeline_cpu"] = added / pipeline if pipeline else float("nan")
    print(f"signing: recorder +{cost['recorder_sign_us']:.1f} µs/event ({cost['recorder_on_over_off']:.2f} x its"
          f" encode+validate), sequencer decide {cost['sequencer_off_us']:.1f} -> {cost['sequencer_on_us']:.1f}"
          f" µs/event ({cost['sequencer_on_over_off']:.2f} x); +{added:.1f} µs/event ="
          f" {cost['added_share_of_pipeline_cpu']:.1%} of the pipeline's CPU per event at capacity")
    return cost


def _redaction(payloads: list[tuple[str, bytes]], report: dict[str, Any]) -> dict[str, Any]:
    """The pattern redactor's CPU per event (``redaction.py``; TURNLOG_REDACTION=patterns), and its share of
    the pipeline's CPU per event at capacity measured in this run (it runs in the agents' processes)."""
    cost = redaction_cost(payloads)
    pipeline = report.get("cpu_at_capacity", {}).get("pipeline_us_per_event", float("nan"))
    cost["share_of_pipeline_cpu"] = cost["per_event_us"] / pipeline if pipeline else float("nan")
    print(f"redaction (patterns): {cost['completed_us']:.1f} µs per completed turn, {cost['partial_us']:.1f} µs per"
          f" partial; {cost['per_event_us']:.1f} µs/event = {cost['per_event_over_encode_validate']:.2f} x the"
          f" recorder's encode+validate, {cost['share_of_pipeline_cpu']:.1%} of the pipeline's CPU per event")
    return cost


def _encryption_cost(payloads: list[tuple[str, bytes]], report: dict[str, Any]) -> dict[str, Any]:
    """Envelope encryption's CPU and bytes per event on and off (``encryption.py``), and the CPU's
    share of the pipeline's CPU per event at capacity when this run measured it."""
    cost = encryption_cost(payloads)
    pipeline = report.get("cpu_at_capacity", {}).get("pipeline_us_per_event", float("nan"))
    cost["added_share_of_pipeline_cpu"] = cost["added_us_per_event"] / pipeline if pipeline else float("nan")
    print(f"encryption: recorder {cost['recorder_off_us']:.1f} -> {cost['recorder_on_us']:.1f} µs/event, reader"
          f" {cost['reader_off_us']:.1f} -> {cost['reader_on_us']:.1f}, sink planning {cost['sink_plan_off_us']:.1f}"
          f" -> {cost['sink_plan_on_us']:.1f}; wrap {cost['wrap_us_per_epoch']:.0f} / unwrap"
          f" {cost['unwrap_us_per_epoch']:.0f} µs per session epoch; {cost['plain_bytes_per_event']:,.0f} ->"
          f" {cost['sealed_bytes_per_event']:,.0f} bytes/event")
    return cost
