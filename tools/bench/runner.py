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

The phases are the table :data:`PHASES`, in that order, each a function ``(run, report) -> None``
(``pipeline_phases.py``, ``feature_phases.py``, ``resume_phase.py``, ``direct_phase.py``) that adds its
figures to the report. What a phase needs from an earlier one it reads from the report or from the
run's context (``context.py``: the pipeline's processes and sampler, the capacity C and the sustained
rate M). ``only`` runs one entry of :data:`ALONE` instead. Then the table is printed (``table.py``)
and the report written.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Generic, TypeVar

from pydantic import SecretStr
from sqlalchemy.engine import make_url

from turnlog.deploy.processes import ServiceProcess, stop_all
from turnlog.deploy.topics import create_topics, delete_topics_with_prefix
from turnlog.exceptions import ConfigurationError
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store
from turnlog.tools.bench.context import BenchRun, Report, Workload
from turnlog.tools.bench.databases import create_database, drop_database
from turnlog.tools.bench.direct_phase import measure_direct
from turnlog.tools.bench.feature_phases import (
    compare_encryption,
    compare_tracing,
    compare_transactions,
    measure_encryption_cost,
    measure_redaction,
    measure_signing,
    measure_tracing_cost,
)
from turnlog.tools.bench.options import BenchOptions
from turnlog.tools.bench.pipeline_phases import (
    measure_baselines,
    measure_capacity,
    measure_latency,
    measure_memory,
    search_sustained,
    stop_sampler,
    wait_drained,
)
from turnlog.tools.bench.probes import require_commit_timestamps
from turnlog.tools.bench.ratios import report_ratios
from turnlog.tools.bench.resume_phase import measure_resume
from turnlog.tools.bench.table import print_table
from turnlog.tools.bench.workload import SessionPlan, encoded_events, plan_sessions

__all__ = ["run_bench", "require_extras", "Phase", "PHASES", "ALONE"]

#: The context a phase gets: :class:`~turnlog.tools.bench.context.Workload` or a full run's ``BenchRun``.
C = TypeVar("C", bound=Workload)


@dataclass(frozen=True)
class Phase(Generic[C]):
    """One entry of a phase table: ``run`` adds the phase's figures to the report (under ``name``
    among others)."""

    name: str
    run: Callable[[C, Report], None]
    #: Whether these options switch the phase off (None: it always runs).
    off: Callable[[BenchOptions], bool] | None = None
    #: A failure is recorded as ``{"error": ...}`` under ``name`` and the run goes on (the other
    #: figures still stand); without, it ends the run.
    recovers: bool = False
    #: Called after a failure was recorded, before the next phase.
    after_failure: Callable[[C], None] | None = None


def _add_ratios(run: BenchRun, report: Report) -> None:
    """Every figure over its baseline of the same run (``ratios.py``): ``ratios``."""
    report["ratios"] = report_ratios(report)


#: A full run's phases, in order, on the run's own database, topics and pipeline. ``--quick``
#: (:func:`~turnlog.tools.bench.options.quick_options`) shortens them and switches none off.
PHASES: tuple[Phase[BenchRun], ...] = (
    Phase("baselines", measure_baselines),
    # Transactions, then encryption, on and off under load on pipelines of their own, before the run's
    # own pipeline starts (encryption's cost per event: below).
    Phase("transactions", compare_transactions, off=lambda o: o.transactions_repetitions == 0, recovers=True),
    Phase("encryption", compare_encryption, off=lambda o: o.encryption_repetitions == 0, recovers=True),
    # Drains a backlog: starts the pipeline and the sampler, measures C and the CPU per event at capacity.
    Phase("capacity", measure_capacity),
    # Write-side isolation's, redaction's and encryption's CPU per event in this process, each with its
    # share of the pipeline's CPU per event at capacity (the report's cpu_at_capacity).
    Phase("signing", measure_signing),
    Phase("redaction", measure_redaction),
    Phase("encryption_cost", measure_encryption_cost),
    # M, searched down from 0.9 C: it sets the load of the latency, resume and direct peer phases.
    Phase("sustained", search_sustained),
    Phase("latency", measure_latency),
    # A failed resume phase's load may still be in the pipeline: it catches up before the next phase.
    Phase("resume", measure_resume, recovers=True,
          after_failure=lambda run: wait_drained(run.running_sampler(), 300)),
    # In a database of its own: the pipeline's figures still stand if it fails.
    Phase("direct", measure_direct, off=lambda o: not o.direct, recovers=True),
    Phase("memory", measure_memory),
    Phase("timeline", stop_sampler),
    Phase("ratios", _add_ratios),
)

#: The phases ``options.only`` runs alone, in order: their variants make their own databases and
#: topics, so the run makes none of its own. Asked for, a phase runs whatever its repetitions (one
#: pair at least), and its failure ends the run.
ALONE: dict[str, tuple[Phase[Workload], ...]] = {
    "transactions": (Phase("transactions", compare_transactions),),
    "encryption": (Phase("encryption_cost", measure_encryption_cost), Phase("encryption", compare_encryption)),
    "tracing": (Phase("tracing_cost", measure_tracing_cost), Phase("tracing", compare_tracing)),
}


def require_extras(options: BenchOptions) -> None:
    """Refuse, before any work, a plot or profile the ``bench`` extra's tools are missing for.

    Raises:
        ConfigurationError: ``plot_path`` without matplotlib, ``profile_dir`` without py-spy.
    """
    if options.plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise ConfigurationError("--plot needs matplotlib: pip install 'turnlog[bench]'")
    if options.profile_dir is not None and shutil.which("py-spy") is None:
        raise ConfigurationError("--profile-dir needs py-spy: pip install 'turnlog[bench]'")


def run_bench(settings: TurnlogSettings, options: BenchOptions) -> Report:
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
    settings = _run_settings(settings, options, run, sqlalchemy_dsn)
    log_dir = options.log_dir / run
    report: Report = {"run_id": run, "options": {k: str(v) for k, v in asdict(options).items()}}
    if options.only is not None:
        require_commit_timestamps(admin_psycopg)
        plans, payloads = _workload(options, run, f", {options.only} only")
        _run_phases(ALONE[options.only], Workload(settings, options, run, log_dir, plans, payloads), report)
        return _finish(report, options)
    create_database(admin_psycopg, database)
    processes: dict[str, ServiceProcess] = {}
    try:
        require_commit_timestamps(psycopg_dsn)
        open_store(sqlalchemy_dsn).upgrade_schema()
        create_topics(settings)
        plans, payloads = _workload(options, run, "")
        context = BenchRun(settings, options, run, log_dir, plans, payloads, database=database, dsn=psycopg_dsn,
                           admin_dsn=admin_psycopg, processes=processes)
        _run_phases(PHASES, context, report)
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


def _run_phases(phases: Sequence[Phase[C]], context: C, report: Report) -> None:
    """``phases`` in order, each adding its figures to ``report``; those its options switch off skipped."""
    for phase in phases:
        if phase.off is not None and phase.off(context.options):
            continue
        if not phase.recovers:
            phase.run(context, report)
            continue
        try:
            phase.run(context, report)
        except Exception as e:  # the other figures still stand
            report[phase.name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{phase.name} phase failed: {report[phase.name]['error']}")
            if phase.after_failure is not None:
                phase.after_failure(context)


def _run_settings(settings: TurnlogSettings, options: BenchOptions, run: str, database_url: str) -> TurnlogSettings:
    """``settings`` for run ``run``: its database, topics, consumer groups and folders of its own."""
    return settings.model_copy(
        update=dict(
            database_url=SecretStr(database_url),
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
            insecure_open_fleets=True,
            epoch_grant_key=None,
            flush_interval_seconds=options.flush_interval,
            log_level="WARNING",
        )
    )


def _workload(options: BenchOptions, run: str, label: str) -> tuple[list[SessionPlan], list[tuple[str, bytes]]]:
    """The run's session plans and their events, encoded (one pass of the workload)."""
    plans = plan_sessions(options.sessions_dir, options.sessions, options.turns_per_session, run_id=run)
    payloads = encoded_events(plans, flush_interval=options.flush_interval, speed=options.speed)
    print(f"turnlog bench {run}{label}: {len(plans)} sessions x {options.turns_per_session} turns ="
          f" {len(payloads):,} events per pass")
    return plans, payloads


def _finish(report: Report, options: BenchOptions) -> Report:
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
