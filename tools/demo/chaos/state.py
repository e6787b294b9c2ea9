"""A chaos run's state (:class:`_Run`): its processes, what happened to them, and the little every
action needs (the run's clock, its records, its background steps). The actions that work on it are
in ``faults.py`` and ``cluster.py``, its watchers in ``watch.py``."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from turnlog.deploy.cluster import LocalCluster
from turnlog.deploy.processes import ServiceProcess, turnlog_command
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore
from turnlog.tools.demo.chaos.options import ChaosOptions
from turnlog.tools.demo.group_probe import GroupProbe
from turnlog.tools.demo.latency import CompletedTurn, LatencyReader, StoredTurns
from turnlog.tools.demo.runner import AgentProcess, agent_session_options, load_sessions
from turnlog.tools.demo.schedule import OUTAGE_WINDOW
from turnlog.tools.demo.scrape_targets import ScrapeTargets

logger = logging.getLogger(__name__)


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
        # The run's sessions by key, as the store, the latency logs and the report name them.
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
            "replay-agent", str(self.paths[session_id]), *agent_session_options(session_id),
            "--speed", f"{self.speed:.4f}", "--base-time", self.base_time.isoformat(),
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

    # -- service workers --
    def workers_of(self, component: str) -> list[str]:
        """The names of ``component``'s workers ("sink", "sink-2", ...)."""
        return sorted(worker for worker, service in self.components.items() if service == component)

    def start_service(self, component: str, log_name: str, worker: str) -> ServiceProcess:
        """Start a process of ``component`` as ``worker`` (its replacement keeps the worker's metrics port)."""
        env = self.env | self.scrape_targets.environment(component, worker)
        return ServiceProcess(component, turnlog_command(component), env, self.log_dir / f"{log_name}.log",
                              ready_path=self.log_dir / f"{log_name}.ready")

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
