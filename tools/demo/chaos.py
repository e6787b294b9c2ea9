"""``turnlog chaos``: the demo workload under SIGKILLs of every component and long outages.

For ``duration`` seconds the real transcripts are replayed (time-compressed so
the longest spans 85% of the run, with their real overlapping timing) while a
seeded schedule (:func:`build_schedule`) does, in one run:

- **SIGKILLs** of agents (each resumed in a new process), the sequencer, the
  sink, the finalizer and the Kafka broker, each restarted at once;
- **broker outages** longer than the delivery timeout: the broker SIGKILLed
  and kept down ``max(60, delivery timeout + 30)`` to 120 s (scaled to the
  run), then started again; at least one per run. The agents go on talking
  meanwhile: their recorders must keep every event in their local spool and
  deliver it once the broker is back;
- **agent SIGKILLs during a broker outage**: the resumed process must first
  deliver the dead one's spool and pass the resume barrier, which both wait
  for the broker, so each resume attempt may take the rest of the outage
  (``resume_timeout_seconds`` is set past the longest outage, and a failed
  attempt is retried);
- **Postgres outages**: stopped (``deploy/postgres.sh stop``) or its
  postmaster SIGKILLed, kept down 20 to 60 s (scaled to the run), then started.

With ``cluster`` (``turnlog chaos --cluster``) the run goes to the local 3-node
KRaft cluster (``turnlog.deploy.cluster.LocalCluster``, started if down) with
topics of 3 replicas and min ISR 2, two sequencer and two sink workers and one
finalizer, and its schedule (:func:`build_cluster_schedule`) replaces the
broker's kill and outage with the cluster's faults, one broker fault at a time,
each once every node is back, the ISR full and the pipeline caught up (the
first two under the heaviest load, the other two in a seeded order):

- the node leading the most ``events`` partitions SIGKILLed under load, started
  again after 15 to 45 s;
- a rolling restart: each node stopped and started in turn, each step once
  every partition of the run's topics has its full ISR again;
- one node SIGSTOPped for 30 to 90 s, then SIGCONTed;
- two nodes SIGKILLed for 30 to 60 s (below min ISR, and the controller quorum
  lost), agents SIGKILLed meanwhile, then started;
- and, beside them, a sequencer or sink worker SIGSTOPped for 20 to 40 s, past
  its group's 10 s session timeout, then SIGCONTed (holds are scaled down in
  runs shorter than 600 s). Nothing is left stopped at the end, and every node
  runs again. The producers keep the settings' delivery timeout (120 s), which
  outlasts a failover.

Afterwards every session is judged as in the demo (``turnlog.tools.demo.verdict``)
and the report gives events sent and stored, turns lost, duplicated, altered
and out of order, wrong aggregates (sums of the verdict's typed problems by
kind), each kill and outage with its recovery time, and agents that failed.
Each agent writes every ``complete_turn`` that returned to a latency log
(``<run>/latency/``, :mod:`turnlog.tools.demo.latency`); the run watches the
store for those turns, and the report has, per kind of kill, outage or fault,
the calls' latency p50/p99/max from its start until it recovered, and its
catch-up: from its end until the store held every turn completed by then. A
turn whose ``complete_turn`` returned and that the store never held is a
violation (``acknowledged_not_stored``).

Recovery time, from the SIGKILL (for an outage: from the restart) until the
component works again: a resumed agent's ``resumed`` line; a replacement
sequencer or finalizer seen by the broker as a new member of its consumer
group, with the group stable; a replacement sink storing (or caught up with
the transcript); a broker answering; after an outage, the sink storing again
(or caught up).

Chaos settings: the run's own topics, groups, Faust data and spool folder;
on the single broker ``delivery_timeout_seconds`` is 20 s (120 s by default) so that each outage is
at least three delivery timeouts long: every event spooled during it outlives
its producer's delivery attempts and has to be driven again from the spool,
which is what a recorder that "never gives a session up" must survive.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import logging
import math
import os
import random
import signal
import statistics
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import func, select, text
from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_fixed

from turnlog import kafka
from turnlog.deploy.cluster import LocalCluster
from turnlog.deploy.local import LOCAL_HOSTS, SCRIPTS, ensure_local_services
from turnlog.deploy.processes import ServiceProcess, stop_all, turnlog_command, wait_all_ready
from turnlog.deploy.topics import create_topics, delete_topics_with_prefix
from turnlog.exceptions import ConfigurationError
from turnlog.polling import WaitTimeoutError, wait_until
from turnlog.producers import SessionRecorder
from turnlog.readiness import NotReadyError
from turnlog.schemas import SessionStatus, TurnStatus
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore, StoreUnavailableError, open_store, parse_database_url, safe_url
from turnlog.sinks.driver_errors import store_errors
from turnlog.sinks.tables import sink_offsets, transcript_turns
from turnlog.tools.demo.group_probe import GroupProbe
from turnlog.tools.demo.keys import with_run_keys
from turnlog.tools.demo.latency import (
    CompletedTurn,
    FaultWindow,
    LatencyReader,
    StoredTurns,
    figures_by_kind,
    format_table,
)
from turnlog.tools.demo.runner import (
    AgentProcess,
    count_events,
    load_sessions,
    print_table,
    start_lag_exporter,
    wait_for_finalized,
)
from turnlog.tools.demo.schedule import (
    AFTER_OUTAGE_SECONDS,
    BROKER_FAULTS,
    CLUSTER_COMPONENTS,
    CLUSTER_FAULTS,
    COMPONENTS,
    EXPECTED_RECOVERY_SECONDS,
    OUTAGE_WINDOW,
    WORKER_PAUSE,
    PlannedFault,
    PlannedKill,
    PlannedOutage,
    Schedule,
    build_cluster_schedule,
    build_schedule,
)
from turnlog.tools.demo.scrape_targets import ScrapeTargets
from turnlog.tools.demo.verdict import Problem, ProblemKind, SessionVerdict, judge_session, problem_totals

__all__ = [
    "ChaosOptions",
    "run_chaos",
    "build_schedule",
    "build_cluster_schedule",
    "Schedule",
    "PlannedKill",
    "PlannedOutage",
    "PlannedFault",
    "COMPONENTS",
    "CLUSTER_COMPONENTS",
    "CLUSTER_FAULTS",
    "SessionProblem",
    "ProblemTally",
    "tally_problems",
]

logger = logging.getLogger(__name__)
SERVICES = ("sequencer", "sink", "finalizer")
RECOVERY_TIMEOUT_SECONDS = 120.0
RESUME_ATTEMPTS = 4
#: Between a failed resume attempt and the next (seconds).
RESUME_RETRY_SECONDS = 2.0
#: The chaos run's producer delivery timeout (see the module docstring).
CHAOS_DELIVERY_TIMEOUT_SECONDS = 20.0
#: The cluster mode's workers (name -> service): two of the sequencer and of the sink, one finalizer.
CLUSTER_WORKERS = {"sequencer": "sequencer", "sequencer-2": "sequencer", "sink": "sink", "sink-2": "sink",
                   "finalizer": "finalizer"}
#: The cluster mode's topics: this many replicas, min ISR one less.
CLUSTER_REPLICATION_FACTOR = 3
#: How often the run looks for the agents' completed turns in the store (seconds).
STORE_POLL_SECONDS = 0.5
LATEST_SERVICE_KILL = 1.5  # a service kill held up past this (fraction of ``duration``) is skipped
PIPELINE_READY_TIMEOUT_SECONDS = 180.0


@dataclass(frozen=True, slots=True)
class ChaosOptions:
    sessions_dir: Path
    duration: float = 300.0
    seed: int = 1
    kills: int = 25
    #: agents SIGKILLed (and resumed) during each broker outage (with ``cluster``: while two brokers are down)
    outage_agent_kills: int = 2
    report_path: Path | None = None
    flush_interval_seconds: float = 0.2
    #: None: ``CHAOS_DELIVERY_TIMEOUT_SECONDS`` on the single broker, the settings' own on the cluster
    delivery_timeout_seconds: float | None = None
    log_dir: Path = Path(".turnlog-chaos")
    state_dir: Path = Path(os.environ.get("TURNLOG_STATE_DIR", Path.home() / ".cache" / "turnlog"))
    #: run on the local 3-node cluster (``deploy/cluster.py``) with its faults instead of the single broker's
    cluster: bool = False
    #: the cluster's state root (``TURNLOG_STATE_DIR`` of its ``deploy/kafka.sh``); None: ``state_dir``. Its
    #: ports are the script's (``TURNLOG_KAFKA_CLUSTER_PORT``, ``TURNLOG_KAFKA_CLUSTER_CONTROLLER_PORT``).
    cluster_state_dir: Path | None = None
    #: a Prometheus file_sd folder: every process gets a metrics port, listed in ``turnlog-chaos.json`` there
    #: (tools/demo/scrape_targets.py); None: no metrics ports
    prometheus_targets: Path | None = None
    #: serve ``turnlog api`` (its operations page, ``/ops``) on this port for the run's length, never killed by
    #: the schedule; its tokens are ``TURNLOG_API_TOKENS`` (one granting "*" reads /ops), its Prometheus
    #: ``TURNLOG_OPS_PROMETHEUS_URL``. None: no API
    ops_port: int | None = None


# -- the run -------------------------------------------------------------------------


@dataclass(slots=True)
class _Agent:
    """The newest agent process of a session and what its progress lines say."""

    process: AgentProcess | None = None
    generation: int = 0
    open_turns: int = 0
    state: str = "starting"  # starting | resuming | running | done | killed | failed
    failed: list[str] = field(default_factory=list)  # processes of this session that exited on their own with an error
    failed_resumes: list[str] = field(default_factory=list)  # resume attempts that exited with an error (then retried)


class _Run:
    """One chaos run: the processes, the schedule's execution, and what happened."""

    def __init__(
        self,
        settings: TurnlogSettings,
        options: ChaosOptions,
        run_id: str,
        store: SqlStore,
        cluster: LocalCluster | None = None,
    ) -> None:
        self.settings = settings
        self.options = options
        self.store = store
        self.cluster = cluster
        self.log_dir = options.log_dir / run_id
        self.latency = LatencyReader(self.log_dir / "latency")  # the agents' complete_turn calls
        self.stored_turns = StoredTurns()  # when each turn was first seen stored complete
        self.completed: list[CompletedTurn] = []  # the calls read so far (watch_store)
        self.tracked_at = -math.inf  # when watch_store last read the latency logs (monotonic)
        # the run's topics (their ISR is waited for after a broker fault)
        self.topics: list[str] = [settings.topics.events, settings.topics.transcript]
        self.fault_rng = random.Random(options.seed + 2)  # which node or worker a fault or a service kill hits
        #: service worker name (e.g. "sink-2") -> its service ("sink")
        self.components: dict[str, str] = {}
        self.paused_pids: set[int] = set()  # service workers this run SIGSTOPped and has not SIGCONTed yet
        #: cleared while two brokers are down: service kills and pipeline faults wait for it
        self.brokers_whole = threading.Event()
        self.brokers_whole.set()
        #: the consumer groups' members, asked from a child process (an admin request can abort this one)
        self.group_probe = GroupProbe(settings.as_environment(), self.log_dir / "group-probe.log")
        self.env = settings.as_environment()
        self.scrape_targets = ScrapeTargets(options.prometheus_targets, "turnlog-chaos")
        self.transcripts, self.paths = load_sessions(options.sessions_dir, run_id)
        longest = max(max(t.end_s for t in turns) - turns[0].start_s for turns in self.transcripts.values())
        self.speed = longest / (options.duration * OUTAGE_WINDOW[1])
        self.base_time = dt.datetime.now(dt.UTC).replace(microsecond=0)
        self.rng = random.Random(options.seed + 1)  # which agent is killed, picked among those mid-turn
        self.lock = threading.Condition()
        self.agents: dict[str, _Agent] = {sid: _Agent() for sid in self.transcripts}
        self.agent_kills: dict[str, int] = defaultdict(int)
        self.records: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.failed_resumes: list[str] = []
        self.killed: set[str] = set()  # names of the agent processes this run SIGKILLed
        self.services: dict[str, ServiceProcess] = {}
        self.service_lock = threading.Lock()  # one service kill or outage (and its recovery) at a time
        self.services_lock = threading.Lock()  # guards replacing a process in ``services``
        self.service_exits: list[dict[str, Any]] = []  # services that exited by themselves (then restarted)
        self.finished = threading.Event()
        self.ours: set[str] = set()  # "broker" / "postgres" while this run is stopping or starting it
        self.down_by_us: set[str] = set()  # ... and while it keeps it down (an outage)
        self.interference: list[dict[str, Any]] = []  # broker or Postgres restarts this run did not make
        self.outage: str | None = None  # the service that is down now, if any
        self.threads: list[threading.Thread] = []
        self.started = time.monotonic()
        # Events found in orphaned spools at the end, and left undelivered.
        self.spool_drain: tuple[int, int] | None = None
        # Schedule steps that failed (a service that did not come back up): the run is void.
        self.step_failures: list[str] = []

    # -- time and records --
    def now(self) -> float:
        return time.monotonic() - self.started

    def sleep_until(self, at: float) -> None:
        delay = self.started + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.records.append(entry)
        what = entry["component"] + (f" ({entry['during']})" if entry.get("during") else "")
        down = f", down {entry['down_seconds']:.1f}s" if "down_seconds" in entry else ""
        recovered = entry.get("recovery_seconds")
        result = f"recovered in {recovered:.2f}s" if recovered is not None else f"NOT RECOVERED ({entry.get('error')})"
        print(f"  {entry['at_seconds']:6.1f}s {entry['action']:<7} {what:<24} {entry['target']}{down}: {result}",
              flush=True)

    def background(self, name: str, target: Any, *args: Any) -> None:
        def step() -> None:
            try:
                target(*args)
            except Exception as e:  # the schedule did not run as planned: say so in the verdict
                logger.exception("chaos: schedule step %s failed", name)
                with self.lock:
                    self.step_failures.append(f"{name}: {type(e).__name__}: {e}")

        thread = threading.Thread(target=step, name=name, daemon=True)
        with self.lock:
            self.threads.append(thread)
        thread.start()

    # -- agents --
    def spawn(self, session_id: str, *extra: str) -> AgentProcess:
        with self.lock:
            agent = self.agents[session_id]
            agent.generation += 1
            agent.open_turns = 0
            agent.state = "resuming" if extra else "starting"
            generation = agent.generation
            name = f"agent{generation}:{session_id}"
        file_name = name.replace(":", "-")
        argv = turnlog_command(
            "replay-agent", str(self.paths[session_id]), "--session-id", session_id, "--speed", f"{self.speed:.4f}",
            "--base-time", self.base_time.isoformat(),
            "--latency-log", str(self.latency.folder / f"{file_name}.jsonl"), *extra,
        )
        env = self.env | self.scrape_targets.environment("agent", session_id)  # a resumed agent keeps the port
        process = ServiceProcess(name, argv, env, self.log_dir / f"{file_name}.log", stdout_pipe=True)
        started = AgentProcess(process, self.on_line)
        with self.lock:
            agent.process = started
        self.background(f"watch-{name}", self.watch_agent, session_id, started, generation)
        return started

    def on_line(self, process: AgentProcess, line: dict[str, object]) -> None:
        name, session_id = process.process.name.split(":", 1)
        with self.lock:
            agent = self.agents[session_id]
            if int(name.removeprefix("agent")) != agent.generation or agent.state == "killed":
                return  # a line the reader thread got after its process was killed
            kind = line.get("type")
            if kind in ("started", "resumed"):
                agent.state = "running"
            elif kind == "turn":
                agent.open_turns += 1
            elif kind == "said":
                agent.open_turns -= 1
            elif kind in ("done", "terminated"):
                agent.state = "done"
                self.scrape_targets.remove(session_id)  # its session ended: no longer a target
            self.lock.notify_all()

    def watch_agent(self, session_id: str, process: AgentProcess, generation: int) -> None:
        code = process.process.popen.wait()
        name = process.process.name
        with self.lock:
            agent = self.agents[session_id]
            newest = agent.generation == generation
            if code != 0 and name not in self.killed:
                where = f"{name} (exit {code}, log {process.process.log_path})"
                # a resume attempt that gave up is retried; an agent that died while talking lost its session
                (agent.failed_resumes if newest and agent.state == "resuming" else agent.failed).append(where)
            if newest and name not in self.killed:
                agent.state = "done" if code == 0 else "failed"
            self.lock.notify_all()

    def kill_process(self, process: AgentProcess) -> None:
        with self.lock:
            self.killed.add(process.process.name)
        process.process.kill()

    def kill_agent(self, during: str | None) -> None:
        """SIGKILL an agent that has a turn open, and resume its session in a new process (in the background)."""
        at = self.now()
        with self.lock:
            candidates = sorted(
                sid for sid, a in self.agents.items()
                if a.state == "running" and a.open_turns > 0 and a.process is not None and a.process.process.alive()
            )
            if not candidates:
                self.skipped.append({"at_seconds": round(at, 1), "component": "agent", "during": during,
                                     "why": "no agent was mid-turn"})
                print(f"  {at:6.1f}s skip    agent: none mid-turn")
                return
            session_id = self.rng.choice(candidates)
            agent = self.agents[session_id]
            agent.state = "killed"
            open_turns = agent.open_turns
            process = agent.process
        assert process is not None
        self.kill_process(process)
        self.agent_kills[session_id] += 1
        self.background(f"resume-{session_id}", self.resume_agent, session_id, at, open_turns, during)

    def resume_agent(self, session_id: str, killed_at: float, open_turns: int, during: str | None) -> None:
        """Resume in a new process, retrying a failed attempt (an operator or a supervisor would):
        up to ``RESUME_ATTEMPTS`` processes, ``RESUME_RETRY_SECONDS`` apart."""
        timeout = self.settings.resume_timeout_seconds + 60.0
        numbers = itertools.count(1)

        def attempt() -> int | None:
            """One resume process: its attempt number if it resumed; None if it failed (it is killed)."""
            number = next(numbers)
            process = self.spawn(session_id, "--resume")
            with self.lock:
                self.lock.wait_for(lambda: self.agents[session_id].state != "resuming", timeout=timeout)
                state = self.agents[session_id].state
            if state in ("running", "done"):
                return number
            logger.warning("resume of %s failed (attempt %d, %s); see %s", session_id, number, state,
                           process.process.log_path)
            self.kill_process(process)
            return None

        retrying = Retrying(
            retry=retry_if_result(lambda number: number is None),
            stop=stop_after_attempt(RESUME_ATTEMPTS),
            wait=wait_fixed(RESUME_RETRY_SECONDS),
            retry_error_callback=lambda _: None,
        )
        resumed_at_attempt = retrying(attempt)
        if resumed_at_attempt is not None:
            self.record({
                "at_seconds": round(killed_at, 1), "action": "SIGKILL", "component": "agent", "target": session_id,
                "during": during, "open_turns": open_turns, "resume_attempts": resumed_at_attempt,
                "recovery_seconds": round(self.now() - killed_at, 2),
            })
            return
        with self.lock:
            self.failed_resumes.append(session_id)
        self.record({
            "at_seconds": round(killed_at, 1), "action": "SIGKILL", "component": "agent", "target": session_id,
            "during": during, "open_turns": open_turns, "resume_attempts": RESUME_ATTEMPTS, "recovery_seconds": None,
            "error": "every resume attempt failed",
        })

    # -- services --
    def kill_service(self, planned: PlannedKill) -> None:
        self.brokers_whole.wait()  # a replacement cannot join a group while two brokers are down
        with self.service_lock:
            at = self.now()
            if at > LATEST_SERVICE_KILL * self.options.duration:
                self.skipped.append({"at_seconds": round(at, 1), "component": planned.component,
                                     "why": "too late (an outage or a recovery ran long)"})
                print(f"  {at:6.1f}s skip    {planned.component}: too late")
                return
            began = time.monotonic()
            error = None
            if planned.component == "broker":
                with self.our("broker"):
                    target = _kill_broker(self.options.state_dir)
                    _script("kafka.sh", "start")
                recovered = _held_within(lambda: _broker_answers(self.settings), RECOVERY_TIMEOUT_SECONDS,
                                         "the broker to answer")
            else:
                component = planned.component
                groups = {"sequencer": self.settings.sequencer_group, "finalizer": self.settings.finalizer_group}
                group = groups.get(component)
                probe = self.group_probe
                members: frozenset[str] = frozenset()
                if group is not None:  # who is in the group before the kill (the broker may still be settling)
                    _held_within(lambda: bool(probe.members(group)[1]), 30.0, f"members in group {group}", every=0.5)
                    members = probe.members(group)[1]
                before = _sink_progress(self.store, self.settings) if component == "sink" else 0
                with self.services_lock:
                    workers = self.workers_of(component)
                    worker = workers[0] if len(workers) == 1 else self.fault_rng.choice(workers)
                    killed = self.services[worker].pid
                    self.services[worker].kill()
                    self.services[worker] = self.start_service(component, f"{worker}-{int(at)}", worker)
                    target = f"pid {killed} (replaced by pid {self.services[worker].pid})"
                    if len(workers) > 1:
                        target = f"{worker} {target}"
                if group is not None:
                    recovered = _held_within(lambda: _group_rejoined(probe, group, members), RECOVERY_TIMEOUT_SECONDS,
                                             f"the {component} to rejoin group {group}", every=0.5)
                else:
                    recovered = _held_within(lambda: self.sink_moved(before), RECOVERY_TIMEOUT_SECONDS,
                                             "the sink to store again", every=0.5)
            if not recovered:
                error = f"not recovered within {RECOVERY_TIMEOUT_SECONDS:.0f}s"
                if planned.component in ("sequencer", "finalizer"):
                    error += f" (the group's last description: {self.group_probe.last_answer})"
            self.record({
                "at_seconds": round(at, 1), "action": "SIGKILL", "component": planned.component, "target": target,
                "recovery_seconds": round(time.monotonic() - began, 2) if recovered else None,
                **({"error": error} if error else {}),
            })

    def workers_of(self, component: str) -> list[str]:
        """The names of ``component``'s workers ("sink", "sink-2", ...)."""
        return sorted(worker for worker, service in self.components.items() if service == component)

    def sink_moved(self, before: int) -> bool:
        """The sink stored something after ``before`` (its summed offsets), or has nothing left to store."""
        pending = _watermarks(self.settings, self.settings.topics.transcript, committed_records=True)
        progress = _sink_progress(self.store, self.settings)
        return pending >= 0 and progress >= 0 and progress > min(before, pending - 1)

    def run_outage(self, planned: PlannedOutage) -> None:
        self.brokers_whole.wait()
        with self.service_lock:
            at = self.now()
            before = _sink_progress(self.store, self.settings)
            with self.lock:
                self.outage = planned.service  # before the kill: an agent killed from now on is killed during it
            with self.our(planned.service):
                if planned.service == "broker":
                    target = _kill_broker(self.options.state_dir)
                else:
                    target = _stop_postgres(self.options.state_dir, planned.method)
            began = self.started + at
            with self.lock:
                self.down_by_us.add(planned.service)
            for offset in planned.agent_kills:
                self.sleep_until(at + offset)
                self.kill_agent(during=f"{planned.service} down")
            self.sleep_until(at + planned.down_seconds)
            restart = time.monotonic()
            down = restart - began
            with self.our(planned.service):
                with self.lock:
                    self.down_by_us.discard(planned.service)
                _script("kafka.sh" if planned.service == "broker" else "postgres.sh", "start")
            if planned.service == "broker":
                answered = _held_within(lambda: _broker_answers(self.settings), RECOVERY_TIMEOUT_SECONDS,
                                        "the broker to answer")
            else:
                answered = _held_within(lambda: _database_answers(self.store), RECOVERY_TIMEOUT_SECONDS,
                                        "the database to answer")
            answered_at = time.monotonic()
            with self.lock:
                self.outage = None
            flowing = answered and _held_within(lambda: self.sink_moved(before), RECOVERY_TIMEOUT_SECONDS,
                                                "the sink to store again", every=0.5)
            entry = {
                "at_seconds": round(at, 1), "action": "outage", "component": f"{planned.service} outage",
                "target": f"{target} ({planned.method})", "down_seconds": round(down, 1),
                "lifted_at_seconds": round(restart - self.started, 1),
                "restart_seconds": round(answered_at - restart, 2),
                "recovery_seconds": round(time.monotonic() - restart, 2) if flowing else None,
                "agents_killed_meanwhile": len(planned.agent_kills),
            }
            if not flowing:
                entry["error"] = "the pipeline did not store again in time"
            self.record(entry)

    @contextlib.contextmanager
    def our(self, service: str) -> Iterator[None]:
        """This run is stopping or starting ``service`` ("broker" or "postgres"): not interference."""
        with self.lock:
            self.ours.add(service)
        try:
            yield
        finally:
            with self.lock:
                self.ours.discard(service)

    def watched_services(self) -> dict[str, tuple[Callable[[], int | None], str]]:
        """The shared services this run acts on: name -> (its pid now or None, the key this run
        marks in ``ours`` while it acts on it). Postgres, and the single broker or each cluster node."""
        state = self.options.state_dir
        watched: dict[str, tuple[Callable[[], int | None], str]] = {
            "postgres": (lambda: _running_pid(state / "postgres" / "postmaster.pid"), "postgres"),
        }
        cluster = self.cluster
        if cluster is None:
            watched["broker"] = (lambda: _running_pid(state / "kafka" / "kafka.pid"), "broker")
        else:
            for node in cluster.node_ids:
                watched[f"node {node}"] = (lambda node=node: cluster.pid(node), "cluster")  # type: ignore[misc]
        return watched

    def watch_shared_services(self) -> None:
        """Record every stop or restart of the shared broker (or cluster nodes) and Postgres this
        run did not make (other people's tests use them too): such a run's figures are not its own."""
        watched = self.watched_services()
        known = {service: pid() for service, (pid, _) in watched.items()}
        while not self.finished.wait(0.5):
            for service, (running_pid, key) in watched.items():
                with self.lock:
                    ours, down = key in self.ours, key in self.down_by_us
                pid = running_pid()
                if ours:
                    known[service] = None  # read again once this run's own stop or start is done
                    continue
                if down:
                    if pid is not None and known[service] != pid:
                        what = f"started (pid {pid}) during this run's outage"
                        self.interference.append({"at_seconds": round(self.now(), 1), "service": service, "what": what})
                        print(f"  {self.now():6.1f}s {service} {what}, by someone else", flush=True)
                    known[service] = pid
                    continue
                if known[service] is None:
                    known[service] = pid
                elif pid != known[service]:
                    what = "stopped" if pid is None else f"restarted (pid {pid})"
                    self.interference.append({"at_seconds": round(self.now(), 1), "service": service, "what": what})
                    print(f"  {self.now():6.1f}s {service} {what} by someone else", flush=True)
                    known[service] = pid

    def start_service(self, component: str, log_name: str, worker: str) -> ServiceProcess:
        """Start a process of ``component`` as ``worker`` (its replacement keeps the worker's metrics port)."""
        env = self.env | self.scrape_targets.environment(component, worker)
        return ServiceProcess(component, turnlog_command(component), env, self.log_dir / f"{log_name}.log",
                              ready_path=self.log_dir / f"{log_name}.ready")

    def supervise_services(self) -> None:
        """Restart a service that exited by itself (a supervisor would), and report it."""
        restarted: dict[str, float] = {}
        while not self.finished.wait(1.0):
            with self.services_lock:
                for worker, process in list(self.services.items()):
                    at = self.now()
                    if process.alive() or at - restarted.get(worker, -60.0) < 5.0:  # back off a crash loop
                        continue
                    restarted[worker] = at
                    exit_code = process.popen.returncode
                    self.services[worker] = self.start_service(self.components[worker], f"{worker}-restarted-{int(at)}",
                                                              worker)
                    self.service_exits.append(
                        {"at_seconds": round(at, 1), "component": worker, "exit": exit_code,
                         "log": str(process.log_path)}
                    )
                    print(f"  {at:6.1f}s {worker} exited by itself (exit {exit_code}, {process.log_path}); "
                          "restarted", flush=True)

    def run_service_kills(self, kills: list[PlannedKill]) -> None:
        for planned in kills:
            self.sleep_until(planned.at)
            self.kill_service(planned)

    # -- latency and catch-up --
    def watch_store(self) -> None:
        """Read the agents' latency logs and note when each call's turn is first seen stored
        complete (``STORE_POLL_SECONDS`` apart; a store that does not answer is asked again)."""
        while not self.finished.wait(STORE_POLL_SECONDS):
            self.track_store()

    def track_store(self) -> None:
        read_at = time.monotonic()
        completed = self.latency.read()
        with self.lock:
            self.completed = completed
        pending = self.stored_turns.pending(completed)
        if pending:
            queried_at = time.monotonic()
            try:
                found = _complete_turns(self.store, sorted({t.session_id for t in pending}))
            except StoreUnavailableError:
                return
            self.stored_turns.observe(found, queried_at)
        with self.lock:
            self.tracked_at = read_at

    def caught_up_at(self, before: float) -> float | None:
        """When the store held every turn whose ``complete_turn`` had returned by ``before``
        (monotonic), as far as the latest look tells; None if not yet (or not looked since)."""
        with self.lock:
            if self.tracked_at < before:
                return None
            completed = self.completed
        return self.stored_turns.caught_up_at(completed, before)

    def wait_caught_up(self, before: float, timeout: float) -> float | None:
        """Seconds from ``before`` until the pipeline caught up with it (:meth:`caught_up_at`); None after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            at = self.caught_up_at(before)
            if at is not None:
                return max(0.0, at - before)
            time.sleep(STORE_POLL_SECONDS / 2)
        return None

    # -- the cluster's faults --
    def run_broker_faults(self, faults: list[PlannedFault]) -> None:
        """The broker faults one after the other, each once the one before has recovered
        (every node back, the ISR full, the pipeline caught up) and ``AFTER_OUTAGE_SECONDS`` later."""
        for planned in faults:
            self.sleep_until(planned.at)
            self.run_broker_fault(planned)
            time.sleep(AFTER_OUTAGE_SECONDS)

    def run_broker_fault(self, planned: PlannedFault) -> None:
        cluster = self.cluster
        assert cluster is not None
        events = self.settings.topics.events
        at = self.now()
        with self.our("cluster"):
            try:
                if planned.kind == "leader_kill":
                    node = cluster.busiest_leader([events])
                    led = sum(1 for p in cluster.partitions([events]) if p.leader == node)
                    cluster.kill(node)
                    target = f"node {node} (led {led} of {self.settings.partitions} events partitions)"
                    self.sleep_until(at + planned.hold_seconds)
                    lifted = time.monotonic()
                    cluster.start(node)
                elif planned.kind == "broker_pause":
                    node = self.fault_rng.choice(list(cluster.node_ids))
                    led = sum(1 for p in cluster.partitions([events]) if p.leader == node)
                    cluster.pause(node)
                    target = f"node {node} (led {led} of {self.settings.partitions} events partitions)"
                    self.sleep_until(at + planned.hold_seconds)
                    lifted = time.monotonic()
                    cluster.resume(node)
                elif planned.kind == "two_brokers_down":
                    nodes = sorted(self.fault_rng.sample(list(cluster.node_ids), 2))
                    self.brokers_whole.clear()
                    with self.lock:
                        self.outage = "two brokers"  # agents killed from now on are killed during it
                    for node in nodes:
                        cluster.kill(node)
                    target = f"nodes {nodes[0]} and {nodes[1]}"
                    for offset in planned.agent_kills:
                        self.sleep_until(at + offset)
                        self.kill_agent(during="two brokers down")
                    self.sleep_until(at + planned.hold_seconds)
                    lifted = time.monotonic()
                    cluster.start()
                elif planned.kind == "rolling_restart":
                    cluster.rolling_restart(self.topics, timeout=RECOVERY_TIMEOUT_SECONDS)
                    lifted = time.monotonic()
                    target = f"nodes {', '.join(map(str, cluster.node_ids))}, one by one"
                else:
                    raise ConfigurationError(f"unknown broker fault {planned.kind!r}")
                held = lifted - (self.started + at)  # a rolling restart: from its first stop to its last step's start
                cluster.wait_isr_full(self.topics, timeout=RECOVERY_TIMEOUT_SECONDS)
                isr_full = time.monotonic()
            except BaseException:
                cluster.resume_all()  # whatever failed, leave no node stopped or down
                cluster.start()
                raise
            finally:
                with self.lock:
                    self.outage = None
                self.brokers_whole.set()
        caught_up = self.wait_caught_up(lifted, RECOVERY_TIMEOUT_SECONDS)
        entry: dict[str, Any] = {
            "at_seconds": round(at, 1), "action": "fault", "component": _fault_label(planned), "target": target,
            "down_seconds": round(held, 1),
            "lifted_at_seconds": round(lifted - self.started, 1),
            "isr_full_seconds": round(isr_full - lifted, 2),
            "recovery_seconds": round(caught_up, 2) if caught_up is not None else None,
            "agents_killed_meanwhile": len(planned.agent_kills),
        }
        if caught_up is None:
            entry["error"] = f"the pipeline did not catch up within {RECOVERY_TIMEOUT_SECONDS:.0f}s"
        self.record(entry)

    def run_worker_pause(self, planned: PlannedFault) -> None:
        """SIGSTOP one worker of ``planned.target`` for its hold, past its group's session timeout, then SIGCONT."""
        self.brokers_whole.wait()
        with self.service_lock:
            at = self.now()
            with self.services_lock:
                worker = self.fault_rng.choice(self.workers_of(planned.target))
                process = self.services[worker]
                with self.lock:
                    self.paused_pids.add(process.pid)
                process.popen.send_signal(signal.SIGSTOP)
            try:
                self.sleep_until(at + planned.hold_seconds)
            finally:
                lifted = time.monotonic()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
                with self.lock:
                    self.paused_pids.discard(process.pid)
            caught_up = self.wait_caught_up(lifted, RECOVERY_TIMEOUT_SECONDS)
            entry: dict[str, Any] = {
                "at_seconds": round(at, 1), "action": "SIGSTOP", "component": _fault_label(planned),
                "target": f"{worker} pid {process.pid}", "down_seconds": round(lifted - self.started - at, 1),
                "lifted_at_seconds": round(lifted - self.started, 1),
                "recovery_seconds": round(caught_up, 2) if caught_up is not None else None,
                "alive_after": process.alive(),
            }
            if caught_up is None:
                entry["error"] = f"the pipeline did not catch up within {RECOVERY_TIMEOUT_SECONDS:.0f}s"
            self.record(entry)

    def release_paused(self) -> None:
        """SIGCONT every worker and node this run SIGSTOPped and has not continued (at the end, whatever happened)."""
        with self.lock:
            pids, self.paused_pids = set(self.paused_pids), set()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if self.cluster is not None:
            self.cluster.resume_all()


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
    cluster: LocalCluster | None = None
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
    if options.cluster:
        cluster = LocalCluster(options.cluster_state_dir or options.state_dir)
        if not cluster.running():
            print(f"starting the local {cluster.nodes}-node cluster ({cluster.bootstrap_servers})", flush=True)
        cluster.start()  # every node that is down
        overrides |= {
            "bootstrap_servers": cluster.bootstrap_servers,
            "replication_factor": CLUSTER_REPLICATION_FACTOR,
            "min_insync_replicas": CLUSTER_REPLICATION_FACTOR - 1,
        }
    settings = with_run_keys(base.model_copy(update=overrides), options.log_dir / run_id)
    database = parse_database_url(settings.database_url)
    if database.get_backend_name() != "postgresql" or database.host not in LOCAL_HOSTS:
        raise ConfigurationError(
            f"turnlog chaos takes the local Postgres down, so its store must be that Postgres, not"
            f" {safe_url(database)}: set TURNLOG_DATABASE_URL or --database-url"
            " (postgresql+psycopg://USER:PASSWORD@127.0.0.1:5433/DATABASE, deploy/README.md)"
        )
    ensure_local_services(settings)
    _require_killable_services(options.state_dir, broker=cluster is None)
    store = open_store(settings.database_url)
    store.upgrade_schema()
    created = create_topics(settings)
    run = _Run(settings, options, run_id, store, cluster)
    run.topics = [spec.topic for spec in created.specs]
    mode = (f"cluster {settings.bootstrap_servers} (RF {created.replication.replication_factor}, min ISR"
            f" {created.replication.min_insync_replicas})" if cluster else f"broker {settings.bootstrap_servers}")
    print(
        f"turnlog chaos {run_id}: {len(run.transcripts)} sessions, speed x{run.speed:.1f}, {options.duration:.0f}s, "
        f"seed {options.seed}, {mode}, delivery timeout {settings.delivery_timeout_seconds:.0f}s, logs in {run.log_dir}"
    )
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
        # The schedule hits a running pipeline, not one starting up (a Faust worker takes a while on 2 cores).
        began = time.monotonic()
        try:  # each service's ready file (turnlog/readiness.py): a Faust worker's rebalance done, the sink assigned
            wait_all_ready(run.services, PIPELINE_READY_TIMEOUT_SECONDS)
        except NotReadyError as e:
            raise ConfigurationError(
                f"the pipeline did not start within {PIPELINE_READY_TIMEOUT_SECONDS:.0f} s: {e}"
            ) from e
        print(f"  pipeline ready in {time.monotonic() - began:.1f}s; the schedule starts now", flush=True)
        run.started = time.monotonic()
        for session_id in run.transcripts:
            run.spawn(session_id)
        for watch in (run.supervise_services, run.watch_shared_services, run.watch_store):
            threading.Thread(target=watch, name=watch.__name__, daemon=True).start()
        run.background("service-kills", run.run_service_kills, [k for k in schedule.kills if k.component != "agent"])

        def outage_at(scheduled: PlannedOutage) -> None:
            run.sleep_until(scheduled.at)
            run.run_outage(scheduled)

        def worker_pause_at(scheduled: PlannedFault) -> None:
            run.sleep_until(scheduled.at)
            run.run_worker_pause(scheduled)

        for outage in schedule.outages:
            run.background(f"outage-{outage.service}", outage_at, outage)
        broker_faults = [f for f in schedule.faults if f.kind in BROKER_FAULTS]
        if broker_faults:
            run.background("broker-faults", run.run_broker_faults, broker_faults)
        for fault in schedule.faults:
            if fault.kind == WORKER_PAUSE:
                run.background(f"pause-{fault.target}", worker_pause_at, fault)
        for planned in (k for k in schedule.kills if k.component == "agent"):
            run.sleep_until(planned.at)
            run.kill_agent(during=run.outage and f"{run.outage} down")
        deadline = time.monotonic() + options.duration * 3 + sum(
            [o.down_seconds for o in schedule.outages] + [f.planned_seconds for f in schedule.faults]
        )
        _join(run, deadline)
        # The host's agents are not coming back: deliver what the last ones left in the spool
        # folder (as `turnlog spool-drain` does), so no session waits on an orphaned spool.
        run.spool_drain = asyncio.run(_drain_spools(settings))
        wait_for_finalized(store, list(run.transcripts), time.monotonic() + RECOVERY_TIMEOUT_SECONDS * 2)
    finally:
        run.finished.set()
        run.group_probe.close()
        run.release_paused()  # a stopped process would not even see the SIGTERM below
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
        if cluster is not None:
            _ensure_cluster_up(cluster)
        _ensure_services_up(options.state_dir, settings, store, broker=cluster is None)
    wall = time.monotonic() - run.started
    run.track_store()  # the calls' turns as the store holds them at the end
    clean = _report(run, schedule, run_id, wall)
    _drop_run_topics(settings, keep=not clean)
    return clean


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


def _fault_label(fault: PlannedFault) -> str:
    """How the report names a fault's kind: "leader kill", "sink pause", ..."""
    if fault.kind == WORKER_PAUSE:
        return f"{fault.target} pause"
    return fault.kind.replace("_", " ")


def _ensure_cluster_up(cluster: LocalCluster) -> None:
    """Leave every node of the cluster running and none stopped (other tests use it too)."""
    cluster.resume_all()
    try:
        cluster.start()
    except (ConfigurationError, subprocess.TimeoutExpired):
        logger.exception("chaos: the local cluster did not start again; start it: TURNLOG_KAFKA_NODES=3"
                         " bash deploy/kafka.sh start")


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


#: Kinds of problem that, in a session whose newest agent never finished (every resume failed,
#: or it died), are that failure: the session was never said to its end, so it is reported
#: apart (as unfinished), not as turns or figures the pipeline lost.
UNFINISHED_SESSION_KINDS = frozenset({
    ProblemKind.SESSION_MISSING, ProblemKind.LOST_TURNS, ProblemKind.WRONG_AGGREGATE, ProblemKind.NOT_FINALIZED,
    ProblemKind.LOG_MISMATCH, ProblemKind.PARTIAL_AFTER_END,
})
#: Kinds the report sums into figures of their own; problems of the other kinds are listed one by one.
FIGURE_KINDS = frozenset({
    ProblemKind.LOST_TURNS, ProblemKind.DUPLICATED_TURNS, ProblemKind.ALTERED_TURNS, ProblemKind.OUT_OF_ORDER,
    ProblemKind.WRONG_AGGREGATE,
})


@dataclass(frozen=True, slots=True)
class SessionProblem:
    """A verdict's problem and the session it was found in; the text is rendered from them."""

    session_id: str
    problem: Problem

    def __str__(self) -> str:
        return f"{self.session_id}: {self.problem}"

    def as_json(self) -> dict[str, Any]:
        return {"session_id": self.session_id, **self.problem.as_json()}


@dataclass(frozen=True, slots=True)
class ProblemTally:
    """The problems a chaos run holds against the pipeline (:func:`tally_problems`)."""

    #: ``count`` summed per kind (every kind present, 0 when none).
    totals: dict[ProblemKind, int]
    #: Those of a kind outside ``FIGURE_KINDS``, in the verdicts' order, each session's in its verdict's order.
    listed: tuple[SessionProblem, ...]


def tally_problems(verdicts: Iterable[SessionVerdict], finished: Collection[str]) -> ProblemTally:
    """Group the verdicts' problems by kind: every problem of a session in ``finished`` (its
    newest agent said it to the end), and of the other sessions those of a kind outside
    ``UNFINISHED_SESSION_KINDS`` (duplicated, altered or reordered turns count everywhere).
    Decided by :class:`ProblemKind` only, never by a problem's text."""
    held = [
        SessionProblem(v.session_id, p)
        for v in verdicts
        for p in v.problems
        if v.session_id in finished or p.kind not in UNFINISHED_SESSION_KINDS
    ]
    return ProblemTally(
        totals=problem_totals(h.problem for h in held),
        listed=tuple(h for h in held if h.problem.kind not in FIGURE_KINDS),
    )


def _report(run: _Run, schedule: Schedule, run_id: str, wall: float) -> bool:
    options, store, settings = run.options, run.store, run.settings
    verdicts = [
        judge_session(store, sid, turns, run.agent_kills.get(sid, 0), base_time=run.base_time)
        for sid, turns in run.transcripts.items()
    ]
    print_table(verdicts)
    problems = [p for v in verdicts for p in v.problems]
    finished = {sid for sid, agent in run.agents.items() if agent.state == "done"}
    tally = tally_problems(verdicts, finished)
    totals = tally.totals
    unfinished = [
        {
            "session_id": v.session_id,
            "agent": run.agents[v.session_id].state,
            "input_turns_not_recorded": v.input_turns - v.complete_turns,
            "status": v.status,
        }
        for v in verdicts
        if v.session_id not in finished
    ]
    failed_agents = [f for a in run.agents.values() for f in a.failed]
    events_sent = _watermarks(settings, settings.topics.events)
    stored = count_events(store, list(run.transcripts))
    figures = {
        "events_sent": events_sent,
        "events_stored": stored,
        "lost_beyond_bound": totals[ProblemKind.LOST_TURNS],
        "duplicated": totals[ProblemKind.DUPLICATED_TURNS],
        "altered": totals[ProblemKind.ALTERED_TURNS],
        "out_of_order": totals[ProblemKind.OUT_OF_ORDER],
        "wrong_aggregates": totals[ProblemKind.WRONG_AGGREGATE],
        "problems_by_kind": {kind.value: n for kind, n in totals.items() if n},
        "other_problems": [str(listed) for listed in tally.listed],  # as printed
        "other_problem_records": [listed.as_json() for listed in tally.listed],  # the same, typed
        "unfinished_sessions": unfinished,  # their agents never finished: a violation of their own
        "failed_agents": failed_agents,
        "failed_resumes": run.failed_resumes,
        "service_exits": run.service_exits,  # restarted; not a violation by itself
        "interference": run.interference,  # the shared broker or Postgres stopped by someone else meanwhile
        "failed_resume_attempts": [f for a in run.agents.values() for f in a.failed_resumes],  # retried
        "group_probe_restarts": run.group_probe.restarts,  # librdkafka aborted an admin request (group_probe.py)
        "orphaned_spool_events_at_end": run.spool_drain[0] if run.spool_drain else None,
        "undelivered_spool_events": run.spool_drain[1] if run.spool_drain else None,
    }
    recovery: dict[str, dict[str, Any]] = {}
    for entry in run.records:
        label = _label(entry)
        recovery.setdefault(label, {"count": 0, "times": []})
        recovery[label]["count"] += 1
        if entry.get("recovery_seconds") is not None:
            recovery[label]["times"].append(entry["recovery_seconds"])
    recovery_figures = {
        label: {
            "count": r["count"],
            "recovered": len(r["times"]),
            "median_seconds": round(statistics.median(r["times"]), 2) if r["times"] else None,
            "max_seconds": round(max(r["times"]), 2) if r["times"] else None,
        }
        for label, r in sorted(recovery.items())
    }
    unrecovered = [e for e in run.records if e.get("recovery_seconds") is None]
    long_broker_outages = [
        e for e in run.records
        if e["component"] == "broker outage" and e["down_seconds"] >= settings.delivery_timeout_seconds + 30
    ]
    postgres_outages = [e for e in run.records if e["component"] == "postgres outage"]
    windows = _fault_windows(run)
    run_end = time.monotonic()
    fault_rows = figures_by_kind(windows, run.completed, run_end=run_end)
    # Turns an agent's complete_turn returned for (acked, or fsynced in its spool) that the store never held.
    not_stored = sorted(run.stored_turns.pending(run.completed), key=lambda t: (t.session_id, t.turn_index))
    figures["acknowledged_turns"] = len(run.completed)
    figures["acknowledged_not_stored"] = len(not_stored)
    if run.cluster is not None:
        happened = {e["component"] for e in run.records}
        missing_kinds = sorted(({_fault_label(f) for f in schedule.faults} | {"postgres outage"}) - happened)
        outages_happened = not missing_kinds
    else:
        missing_kinds = []
        outages_happened = bool(long_broker_outages) and bool(postgres_outages)
    ok = (
        not problems
        and not unfinished
        and all(v.status == SessionStatus.FINALIZED for v in verdicts)
        and not failed_agents
        and not run.failed_resumes
        and not unrecovered
        and run.spool_drain is not None
        and run.spool_drain[1] == 0
        and outages_happened
        and not not_stored
    )
    killed = {e["component"] for e in run.records if e["action"] == "SIGKILL"}
    covered = set(CLUSTER_COMPONENTS if run.cluster is not None else COMPONENTS) <= killed
    print(f"\n{len(run.records)} kills and outages in {wall:.0f}s; events sent {events_sent}, stored {stored}")
    for key in ("lost_beyond_bound", "duplicated", "altered", "out_of_order", "wrong_aggregates"):
        print(f"  {key}: {figures[key]}")
    for session in unfinished:
        print(
            f"  unfinished: {session['session_id']}: its agent is {session['agent']}, "
            f"{session['input_turns_not_recorded']} input turns never recorded, status {session['status']}"
        )
    for listed in tally.listed:
        print(f"  problem: {listed}")
    for line in failed_agents:
        print(f"  agent failed: {line}")
    for session_id in run.failed_resumes:
        print(f"  resume failed: {session_id}")
    for event in run.interference:
        print(f"  NOTE: at {event['at_seconds']}s the shared {event['service']} was {event['what']} by someone else")
    if run.group_probe.restarts:
        print(f"  the group probe's child was replaced {run.group_probe.restarts} times (librdkafka aborted it,"
              " or it did not answer)")
    for exit in run.service_exits:
        print(f"  {exit['component']} exited by itself at {exit['at_seconds']}s (exit {exit['exit']}) "
              "and was restarted")
    if run.spool_drain:
        print(f"  spools left by finished agents: {run.spool_drain[0]} events, {run.spool_drain[1]} left undelivered")
    for label, figure in recovery_figures.items():
        median = "-" if figure["median_seconds"] is None else f"{figure['median_seconds']:.2f}s"
        longest = "-" if figure["max_seconds"] is None else f"{figure['max_seconds']:.2f}s"
        print(f"  recovery {label:<22} {figure['recovered']:>2}/{figure['count']:<2} median {median:>8}  max"
              f" {longest:>8}")
    for turn in not_stored[:20]:
        print(f"  ACKNOWLEDGED, NOT STORED: {turn.session_id} turn {turn.turn_index} (complete_turn returned at"
              f" {turn.returned - run.started:.1f}s)")
    if len(not_stored) > 20:
        print(f"  ... {len(not_stored)} acknowledged turns not stored in all")
    if run.cluster is None and not long_broker_outages:
        print(f"  no broker outage of at least {settings.delivery_timeout_seconds + 30:.0f}s happened")
    for kind in missing_kinds:
        print(f"  no {kind} happened")
    for entry in sorted(run.records, key=lambda e: e["at_seconds"]):
        if entry.get("overlapped"):
            print(f"  {_label(entry)} at {entry['at_seconds']:.0f}s overlapped: {', '.join(entry['overlapped'])}")
    print(f"\ncomplete_turn latency per fault kind ({len(run.completed)} calls; from each fault's start until it"
          " recovered) and catch-up (from the fault's end until the store held every turn completed by then):")
    print(format_table(fault_rows))
    if not covered:
        print(f"  note: SIGKILLs hit {sorted(killed)}, not every component ({len(run.skipped)} skipped,"
              f" {len(schedule.dropped)} dropped for room)")
    for failure in run.step_failures:
        print(f"  SCHEDULE STEP FAILED (the run is void): {failure}")
    ok = ok and not run.step_failures
    print("CHAOS VERDICT: " + ("no violations" if ok else "VIOLATIONS: see above"))
    if options.report_path is not None:
        report = {
            "run_id": run_id, "ok": ok, "kills_cover_every_component": covered, "seed": options.seed,
            "mode": "cluster" if run.cluster is not None else "single broker",
            "duration_seconds": options.duration, "wall_seconds": round(wall, 1), "speed": round(run.speed, 2),
            "settings": {
                "bootstrap_servers": settings.bootstrap_servers,
                "replication_factor": settings.replication_factor,
                "min_insync_replicas": settings.min_insync_replicas,
                "delivery_timeout_seconds": settings.delivery_timeout_seconds,
                "resume_timeout_seconds": settings.resume_timeout_seconds,
                "flush_interval_seconds": settings.flush_interval_seconds,
            },
            **figures, "recovery": recovery_figures, "schedule": schedule.as_json(),
            "faults_by_kind": [row.as_json() for row in fault_rows],
            "fault_kinds_missing": missing_kinds,
            "acknowledged_not_stored_turns": [
                {"session_id": t.session_id, "turn_index": t.turn_index,
                 "returned_at_seconds": round(t.returned - run.started, 2)}
                for t in not_stored
            ],
            "service_workers": run.components,
            "kills": sorted(run.records, key=lambda e: e["at_seconds"]), "skipped": run.skipped,
            "sessions": [v.as_json() for v in verdicts], "schedule_step_failures": run.step_failures,
        }
        options.report_path.write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2) + b"\n")
    return ok


def _label(entry: dict[str, Any]) -> str:
    """A kill's, outage's or fault's kind in the report: its component, and the outage it happened in."""
    return entry["component"] + (f" ({entry['during']})" if entry.get("during") else "")


def _fault_windows(run: _Run) -> list[FaultWindow]:
    """Every kill, outage and fault of the run as a window for the latency table, from its start
    until it recovered: its own probe said so (``recovery_seconds`` after it was lifted) and the
    store held every turn completed by the time it was lifted. Each record gets that catch-up
    (``caught_up_seconds``; None: never) and, for an outage or fault held for a while, the others
    its window overlapped (``overlapped``: their kinds and starts), whose effects its figures share."""
    windows = []
    for entry in run.records:
        start = run.started + entry["at_seconds"]
        lifted = run.started + entry.get("lifted_at_seconds", entry["at_seconds"])
        caught_up_at = run.stored_turns.caught_up_at(run.completed, lifted)
        caught_up = None if caught_up_at is None else max(0.0, caught_up_at - lifted)
        entry["caught_up_seconds"] = None if caught_up is None else round(caught_up, 2)
        recovered = entry.get("recovery_seconds")
        end = None if caught_up is None or recovered is None else lifted + max(caught_up, recovered)
        windows.append(FaultWindow(
            kind=_label(entry), start=start, lifted=lifted, end=end, held=entry.get("down_seconds"),
            recovered=recovered is not None, caught_up=caught_up,
        ))
    run_end = time.monotonic()
    held = [(entry, window) for entry, window in zip(run.records, windows, strict=True) if window.held is not None]
    for entry, window in held:
        entry["overlapped"] = [
            f"{other.kind} at {other_entry['at_seconds']:.0f}s"
            for other_entry, other in held
            if other is not window
            and other.start <= (window.end or run_end) and (other.end or run_end) >= window.start
        ]
    return windows


# -- helpers ------------------------------------------------------------------------


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


def _held_within(probe: Callable[[], object], timeout: float, what: str, *, every: float = 0.1) -> bool:
    """Poll ``probe`` every ``every`` seconds: True once it returns a truthy value, False (logged,
    naming ``what``) after ``timeout`` seconds. The run goes on either way (a False is recorded as
    a component not recovered where it matters)."""
    try:
        wait_until(probe, timeout=timeout, what=what, interval=every)
    except WaitTimeoutError as e:
        logger.error("%s", e)
        return False
    return True


def _script(name: str, command: str) -> None:
    subprocess.run(["bash", str(SCRIPTS / name), command], check=True, capture_output=True, timeout=180)


def _running_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` if that process runs, else None."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def _require_killable_services(state_dir: Path, *, broker: bool) -> None:
    """Fail before the run when the services the schedule SIGKILLs and stops are not the local
    deploy scripts' of ``state_dir`` (their pid files are how chaos finds them).

    Raises:
        ConfigurationError: no running broker (``broker``) or Postgres has its pid file there.
    """
    pid_files = {"Postgres": state_dir / "postgres" / "postmaster.pid"}
    if broker:
        pid_files["the broker"] = state_dir / "kafka" / "kafka.pid"
    for name, pid_file in pid_files.items():
        if _running_pid(pid_file) is None:
            raise ConfigurationError(
                f"turnlog chaos kills {name} started by deploy/services.sh with TURNLOG_STATE_DIR={state_dir},"
                f" and none runs there ({pid_file}): set TURNLOG_STATE_DIR to the state dir its services"
                " were started with"
            )


def _kill_broker(state_dir: Path) -> str:
    """SIGKILL the local broker; what was killed (someone else may have stopped it already)."""
    pid = int((state_dir / "kafka" / "kafka.pid").read_text().split()[0])
    try:
        _kill_pid(pid)
    except ProcessLookupError:
        return f"pid {pid} (was down already)"
    return f"pid {pid}"


def _kill_pid(pid: int) -> int:
    """SIGKILL ``pid`` and wait until it is gone."""
    os.kill(pid, signal.SIGKILL)
    _held_within(lambda: not Path(f"/proc/{pid}").exists(), 30, f"pid {pid} to exit")
    return pid


def _stop_postgres(state_dir: Path, method: str) -> str:
    """Stop the local Postgres: ``stop`` (deploy/postgres.sh, a fast shutdown) or
    ``sigkill`` (the postmaster; its children exit when they see it gone, and
    the next start recovers from the WAL). Returns what was stopped."""
    if method == "stop":
        _script("postgres.sh", "stop")
        return "deploy/postgres.sh stop"
    pid = int((state_dir / "postgres" / "postmaster.pid").read_text().split()[0])
    children = _child_pids(pid)
    _kill_pid(pid)
    # The next postmaster refuses to start while an old backend still holds the shared memory.
    _held_within(lambda: not any(Path(f"/proc/{child}").exists() for child in children), 60,
                 "the postmaster's children to exit")
    return f"postmaster pid {pid}"


def _child_pids(parent: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


def _database_answers(store: SqlStore) -> bool:
    try:
        with store_errors(), store.engine.connect() as conn:
            conn.execute(text("select 1"))
        return True
    except StoreUnavailableError:
        return False


def _ensure_services_up(state_dir: Path, settings: TurnlogSettings, store: SqlStore, *, broker: bool = True) -> None:
    """Whatever happened, leave the shared broker (with ``broker``) and Postgres running (other people use them)."""
    if broker and not _broker_answers(settings):
        subprocess.run(["bash", str(SCRIPTS / "kafka.sh"), "start"], check=False, capture_output=True, timeout=180)
    if not _database_answers(store):
        subprocess.run(["bash", str(SCRIPTS / "postgres.sh"), "start"], check=False, capture_output=True, timeout=180)


#: The probes' clients keep quiet: a broker that does not answer is an answer here.
_QUIET = {"log_level": 0}


def _broker_answers(settings: TurnlogSettings) -> bool:
    return kafka.broker_answers(settings, 2.0, quiet=True)


def _group_rejoined(probe: GroupProbe, group: str, before: frozenset[str]) -> bool:
    """A member the group did not have before the kill has joined, and the group is stable."""
    stable, members = probe.members(group)
    return stable and bool(members - before)


def _watermarks(settings: TurnlogSettings, topic: str, *, committed_records: bool = False) -> int:
    """Records in ``topic`` (the sum of its end offsets; with ``committed_records``, of the offsets
    after each partition's last committed record, where a consumer that read everything stands:
    the transcript is written in transactions), or -1 if the broker did not answer within 5 s."""
    try:
        with kafka.OffsetReader(settings, **_QUIET) as offsets:
            lookup = offsets.record_ends if committed_records else offsets.end_offsets
            ends = lookup(topic, range(settings.partitions), deadline=time.monotonic() + 5.0)
    except kafka.BrokerError:  # the broker may be restarting: "no progress yet"
        return -1
    return sum(ends.values())


def _complete_turns(store: SqlStore, session_ids: list[str]) -> list[tuple[str, int]]:
    """(session id, turn index) of every turn of ``session_ids`` stored complete.

    Raises:
        StoreUnavailableError: the store did not answer.
    """
    with store_errors(), store.engine.connect() as conn:
        rows = conn.execute(
            select(transcript_turns.c.session_id, transcript_turns.c.turn_index)
            .where(transcript_turns.c.session_id.in_(session_ids), transcript_turns.c.status == TurnStatus.COMPLETE)
        ).all()
    return [(session_id, turn_index) for session_id, turn_index in rows]


def _sink_progress(store: SqlStore, settings: TurnlogSettings) -> int:
    try:
        with store_errors(), store.engine.connect() as conn:
            return conn.execute(
                select(func.coalesce(func.sum(sink_offsets.c.next_offset), 0))
                .where(sink_offsets.c.consumer_group == settings.sink_group)
            ).scalar_one()
    except StoreUnavailableError:
        return -1
