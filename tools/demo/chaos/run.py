"""``run_chaos``: a chaos run from start to verdict. It plans the schedule, gives the run its own
topics, groups and spool (on the single broker or the local cluster), starts the pipeline's workers
and, once they are ready, the agents, the watchers and the schedule's steps; then it delivers the
spools the last agents left, waits for every session to be finalized, leaves every shared service
running, and judges the run (``report.py``)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from typing import Any

from turnlog import kafka
from turnlog.deploy.cluster import LocalCluster
from turnlog.deploy.local import LOCAL_HOSTS, ensure_local_services
from turnlog.deploy.processes import ServiceProcess, stop_all, turnlog_command, wait_all_ready
from turnlog.deploy.topics import CreatedTopics, create_topics, delete_topics_with_prefix
from turnlog.exceptions import ConfigurationError
from turnlog.producers import SessionRecorder
from turnlog.readiness import NotReadyError
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store, parse_database_url, safe_url
from turnlog.tools.demo.chaos.cluster import (
    CLUSTER_WORKERS,
    _ensure_cluster_up,
    cluster_settings,
    run_broker_faults,
    start_cluster,
)
from turnlog.tools.demo.chaos.faults import kill_agent, release_paused, run_outage, run_service_kills, run_worker_pause
from turnlog.tools.demo.chaos.options import RECOVERY_TIMEOUT_SECONDS, ChaosOptions
from turnlog.tools.demo.chaos.report import _fault_label, _report
from turnlog.tools.demo.chaos.shared_services import _ensure_services_up, _require_killable_services
from turnlog.tools.demo.chaos.state import _Run
from turnlog.tools.demo.chaos.watch import supervise_services, track_store, watch_shared_services, watch_store
from turnlog.tools.demo.keys import with_run_keys
from turnlog.tools.demo.runner import start_lag_exporter, wait_for_finalized
from turnlog.tools.demo.schedule import (
    BROKER_FAULTS,
    EXPECTED_RECOVERY_SECONDS,
    WORKER_PAUSE,
    PlannedFault,
    PlannedOutage,
    Schedule,
    build_cluster_schedule,
    build_schedule,
)

__all__ = ["run_chaos", "CHAOS_DELIVERY_TIMEOUT_SECONDS"]

logger = logging.getLogger(__name__)
SERVICES = ("sequencer", "sink", "finalizer")
#: The chaos run's producer delivery timeout on the single broker (see the package docstring, ``__init__.py``).
CHAOS_DELIVERY_TIMEOUT_SECONDS = 20.0
PIPELINE_READY_TIMEOUT_SECONDS = 180.0


def run_chaos(base: TurnlogSettings, options: ChaosOptions) -> bool:
    """Run the chaos schedule; print and optionally write the report; True when nothing was violated.

    Raises:
        ConfigurationError: the local cluster (``options.cluster``), the broker or Postgres
            could not be started, or the pipeline did not get ready; ``options.ops_port`` without
            a token granting every fleet.
    """
    if options.ops_port is not None and not any("*" in fleets for fleets in base.api_tokens.values()):
        raise ConfigurationError('--ops-port: /ops needs a token granting every fleet ("*") in TURNLOG_API_TOKENS')
    run_id = uuid.uuid4().hex[:8]
    schedule, delivery_timeout = _plan(base, options)
    cluster = start_cluster(options) if options.cluster else None
    settings = _run_settings(base, options, run_id, schedule, delivery_timeout, cluster)
    _require_local_postgres(settings)
    ensure_local_services(settings)
    _require_killable_services(options.state_dir, broker=cluster is None)
    store = open_store(settings.database_url)
    store.upgrade_schema()
    created = create_topics(settings)
    run = _Run(settings, options, run_id, store, cluster)
    run.topics = [spec.topic for spec in created.specs]
    _print_start(run, run_id, created)
    _print_plan(schedule)

    workers = CLUSTER_WORKERS if cluster else {service: service for service in SERVICES}
    run.components = dict(workers)
    run.services = {worker: run.start_service(service, worker, worker) for worker, service in workers.items()}
    lag_exporter = start_lag_exporter(settings, run.log_dir, run.scrape_targets)
    if run.scrape_targets.path is not None:
        print(f"  Prometheus targets (every worker and agent, and a lag exporter): {run.scrape_targets.path}",
              flush=True)
    ops_api = _start_ops_api(run, options.ops_port) if options.ops_port is not None else None
    try:
        _wait_pipeline_ready(run)
        run.started = time.monotonic()
        _run_schedule(run, schedule)
        # The host's agents are not coming back: deliver what the last ones left in the spool
        # folder (as `turnlog spool-drain` does), so no session waits on an orphaned spool.
        run.spool_drain = asyncio.run(_drain_spools(settings))
        wait_for_finalized(store, list(run.transcripts), time.monotonic() + RECOVERY_TIMEOUT_SECONDS * 2)
    finally:
        _stop_run(run, lag_exporter, ops_api)
    wall = time.monotonic() - run.started
    track_store(run)  # the calls' turns as the store holds them at the end
    clean = _report(run, schedule, run_id, wall)
    _drop_run_topics(settings, keep=not clean)
    return clean


# -- before the run --
def _plan(base: TurnlogSettings, options: ChaosOptions) -> tuple[Schedule, float]:
    """The run's seeded schedule (the cluster's with ``options.cluster``) and its producers' delivery timeout."""
    if options.cluster:
        delivery_timeout = options.delivery_timeout_seconds or base.delivery_timeout_seconds
        schedule = build_cluster_schedule(
            options.seed, options.duration, options.kills, outage_agent_kills=options.outage_agent_kills
        )
    else:
        delivery_timeout = options.delivery_timeout_seconds or CHAOS_DELIVERY_TIMEOUT_SECONDS
        schedule = build_schedule(
            options.seed, options.duration, options.kills, delivery_timeout,
            outage_agent_kills=options.outage_agent_kills,
        )
    return schedule, delivery_timeout


def _run_settings(
    base: TurnlogSettings, options: ChaosOptions, run_id: str, schedule: Schedule, delivery_timeout: float,
    cluster: LocalCluster | None,
) -> TurnlogSettings:
    """``base`` as the run uses it: its own names, its delivery and resume timeouts, its keys, and the
    cluster's servers and replication on ``cluster``."""
    longest_outage = max(
        [o.down_seconds for o in schedule.outages]
        + [f.hold_seconds + EXPECTED_RECOVERY_SECONDS[f.kind] for f in schedule.faults]
    )
    # Its own topics, groups and spool, so the run starts clean and never touches other runs' data.
    overrides: dict[str, Any] = {
        "flush_interval_seconds": options.flush_interval_seconds,
        "delivery_timeout_seconds": delivery_timeout,
        "resume_timeout_seconds": longest_outage + RECOVERY_TIMEOUT_SECONDS,
        "topic_prefix": f"chaos-{run_id}",
        "sequencer_group": f"chaos-{run_id}-sequencer",
        "sink_group": f"chaos-{run_id}-sink",
        "finalizer_group": f"chaos-{run_id}-finalizer",
        "faust_data_dir": str(options.log_dir / run_id / "faust"),
        "spool_dir": str(options.log_dir / run_id / "spool"),
    }
    if cluster is not None:
        overrides |= cluster_settings(cluster)
    return with_run_keys(base.model_copy(update=overrides), options.log_dir / run_id)


def _require_local_postgres(settings: TurnlogSettings) -> None:
    """Raises ConfigurationError unless the store is the local Postgres (the one the run takes down)."""
    database = parse_database_url(settings.database_url)
    if database.get_backend_name() != "postgresql" or database.host not in LOCAL_HOSTS:
        raise ConfigurationError(
            f"turnlog chaos takes the local Postgres down, so its store must be that Postgres, not"
            f" {safe_url(database)}: set TURNLOG_DATABASE_URL or --database-url"
            " (postgresql+psycopg://USER:PASSWORD@127.0.0.1:5433/DATABASE, deploy/README.md)"
        )


def _print_start(run: _Run, run_id: str, created: CreatedTopics) -> None:
    """The run's first line: its sessions, speed, length, seed, mode, delivery timeout and logs."""
    settings, options = run.settings, run.options
    mode = (f"cluster {settings.bootstrap_servers} (RF {created.replication.replication_factor}, min ISR"
            f" {created.replication.min_insync_replicas})" if run.cluster else f"broker {settings.bootstrap_servers}")
    print(
        f"turnlog chaos {run_id}: {len(run.transcripts)} sessions, speed x{run.speed:.1f}, {options.duration:.0f}s, "
        f"seed {options.seed}, {mode}, delivery timeout {settings.delivery_timeout_seconds:.0f}s, logs in {run.log_dir}"
    )


def _print_plan(schedule: Schedule) -> None:
    for outage in schedule.outages:
        kills = f", {len(outage.agent_kills)} agent kills meanwhile" if outage.agent_kills else ""
        print(f"  plan: {outage.service} outage at {outage.at:.0f}s for {outage.down_seconds:.0f}s"
              f" ({outage.method}{kills})")
    for fault in schedule.faults:
        hold = f" for {fault.hold_seconds:.0f}s" if fault.hold_seconds else ""
        kills = f", {len(fault.agent_kills)} agent kills meanwhile" if fault.agent_kills else ""
        print(f"  plan: {_fault_label(fault)} at {fault.at:.0f}s{hold}{kills}")
    dropped = f"; no room for {len(schedule.dropped)} more ({', '.join(schedule.dropped)})" if schedule.dropped else ""
    print(f"  plan: {len(schedule.kills)} SIGKILLs" + dropped)


def _start_ops_api(run: _Run, port: int) -> ServiceProcess:
    """``turnlog api`` over the run's topics, groups and store on ``port`` (loopback), for watching the
    run on ``/ops`` (``run_chaos`` checked that a token grants every fleet). Not one of the run's
    services: no fault hits it and nobody restarts it."""
    env = run.env | run.scrape_targets.environment("api", "api") | {  # with a metrics port when targets are on
        "TURNLOG_API_HOST": "127.0.0.1", "TURNLOG_API_PORT": str(port)}
    process = ServiceProcess("api", turnlog_command("api"), env, run.log_dir / "ops-api.log",
                             ready_path=run.log_dir / "ops-api.ready")
    prometheus = run.settings.ops_prometheus_url or "not configured (TURNLOG_OPS_PROMETHEUS_URL)"
    print(f"  operations page: http://127.0.0.1:{port}/ops (Prometheus: {prometheus})", flush=True)
    return process


def _wait_pipeline_ready(run: _Run) -> None:
    """Raises ConfigurationError when the pipeline did not start in time."""
    # The schedule hits a running pipeline, not one starting up (a Faust worker takes a while on 2 cores).
    began = time.monotonic()
    try:  # each service's ready file (turnlog/readiness.py): a Faust worker's rebalance done, the sink assigned
        wait_all_ready(run.services, PIPELINE_READY_TIMEOUT_SECONDS)
    except NotReadyError as e:
        raise ConfigurationError(
            f"the pipeline did not start within {PIPELINE_READY_TIMEOUT_SECONDS:.0f} s: {e}"
        ) from e
    print(f"  pipeline ready in {time.monotonic() - began:.1f}s; the schedule starts now", flush=True)


# -- the run --
def _run_schedule(run: _Run, schedule: Schedule) -> None:
    """Start every agent, the watchers and the schedule's steps; SIGKILL the agents on time (here);
    return once every step and agent has finished, or at the run's deadline."""
    for session_id in run.transcripts:
        run.spawn(session_id)
    for watch in (supervise_services, watch_shared_services, watch_store):
        threading.Thread(target=watch, args=(run,), name=watch.__name__, daemon=True).start()
    run.background("service-kills", run_service_kills, run, [k for k in schedule.kills if k.component != "agent"])

    def outage_at(scheduled: PlannedOutage) -> None:
        run.sleep_until(scheduled.at)
        run_outage(run, scheduled)

    def worker_pause_at(scheduled: PlannedFault) -> None:
        run.sleep_until(scheduled.at)
        run_worker_pause(run, scheduled)

    for outage in schedule.outages:
        run.background(f"outage-{outage.service}", outage_at, outage)
    broker_faults = [f for f in schedule.faults if f.kind in BROKER_FAULTS]
    if broker_faults:
        run.background("broker-faults", run_broker_faults, run, broker_faults)
    for fault in schedule.faults:
        if fault.kind == WORKER_PAUSE:
            run.background(f"pause-{fault.target}", worker_pause_at, fault)
    for planned in (k for k in schedule.kills if k.component == "agent"):
        run.sleep_until(planned.at)
        kill_agent(run, during=run.outage and f"{run.outage} down")
    deadline = time.monotonic() + run.options.duration * 3 + sum(
        [o.down_seconds for o in schedule.outages] + [f.planned_seconds for f in schedule.faults]
    )
    _join(run, deadline)


def _join(run: _Run, deadline: float) -> None:
    """Until every schedule thread and every session's newest agent has finished."""
    while time.monotonic() < deadline:
        with run.lock:
            busy = [t for t in run.threads if t.is_alive() and not t.name.startswith("watch-")]
            running = [sid for sid, a in run.agents.items() if a.process is not None and a.process.process.alive()]
        if not busy and not running:
            return
        time.sleep(0.5)
    logger.error("chaos: agents or schedule steps still running at the deadline")


async def _drain_spools(settings: TurnlogSettings) -> tuple[int, int]:
    """Deliver the orphaned spools of the run's spool folder: (events found, events left undelivered)."""
    recorder = SessionRecorder(
        settings.model_copy(update={"spool_close_timeout_seconds": RECOVERY_TIMEOUT_SECONDS}),
        producer_id="chaos-spool-drain"
    )
    await recorder.start()
    held = recorder.spooled_events()
    await recorder.close()
    return held, recorder.spooled_events()


# -- after the run --
def _stop_run(run: _Run, lag_exporter: ServiceProcess | None, ops_api: ServiceProcess | None) -> None:
    """Stop every process the run started, and leave the shared services (the cluster's nodes, the
    broker, Postgres) running, whatever happened."""
    run.finished.set()
    run.group_probe.close()
    release_paused(run)  # a stopped process would not even see the SIGTERM below
    with run.services_lock:
        stop_all(run.services)
    for agent in run.agents.values():
        if agent.process is not None:
            agent.process.process.stop(5)
    if lag_exporter is not None:
        lag_exporter.stop(5)
    run.scrape_targets.close()
    if ops_api is not None:
        ops_api.stop(5)
    if run.cluster is not None:
        _ensure_cluster_up(run.cluster)
    _ensure_services_up(run.options.state_dir, run.settings, run.store, broker=run.cluster is None)


def _drop_run_topics(settings: TurnlogSettings, *, keep: bool) -> None:
    """Delete the run's topics (Faust's included) once it is judged, or say where they are when
    ``keep`` (a run with violations, to be looked into). A broker loads every topic it holds at
    each restart: leftover runs made the cluster's restarts outlast their timeout."""
    if keep:
        print(f"  the run's topics are kept for inspection: {settings.topic_prefix}.* and {settings.topic_prefix}-*")
        return
    try:
        delete_topics_with_prefix(settings, settings.topic_prefix)
    except kafka.BrokerError as e:
        logger.warning("chaos: the run's topics (%s.*) were not deleted: %s", settings.topic_prefix, e)
