"""``turnlog demo``: real transcripts, concurrent agents, SIGKILLs, resume, verdict.

1. migrate the store and create the topics;
2. start the sequencer, sink and finalizer as separate processes;
3. start one agent process per transcript (time-compressed replay);
4. SIGKILL ``kills`` agents in the middle of a long turn and resume each
   session in a new process (which passes the resume barrier first);
5. wait until every session is finalized, then judge each one
   (``turnlog.tools.demo.verdict``) and print a table and a verdict.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import random
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import msgspec
from sqlalchemy import func, select

from turnlog.crypto.keys import parse_public_key
from turnlog.deploy.local import ensure_local_services
from turnlog.deploy.processes import ServiceProcess, start_pipeline, stop_all, turnlog_command, wait_all_ready
from turnlog.deploy.topics import create_topics
from turnlog.exceptions import ConfigurationError
from turnlog.schemas import SessionStatus
from turnlog.schemas.session_keys import SessionKeyError, local_id, session_key
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore, open_store
from turnlog.sinks.tables import session_events, sessions
from turnlog.tools.demo.keys import DEMO_FLEET, with_run_keys
from turnlog.tools.demo.scrape_targets import ScrapeTargets
from turnlog.tools.demo.spools import drain_orphaned_spools
from turnlog.tools.demo.transcripts import InputTurn, check_replayable, find_transcripts, load_transcript
from turnlog.tools.demo.verdict import Problem, ProblemKind, SessionVerdict, judge_session

__all__ = ["DemoOptions", "run_demo", "choose_kills", "load_sessions", "agent_session_options"]

logger = logging.getLogger(__name__)
POLL_SECONDS = 0.5
#: Longest the services may take to write their ready files (a Faust worker is slow to start on 2 cores).
PIPELINE_READY_TIMEOUT_SECONDS = 180.0
#: How long the spools finished agents left are given to reach the broker (seconds): a failover's length and more.
SPOOL_DRAIN_TIMEOUT_SECONDS = 180.0


@dataclass(frozen=True, slots=True)
class DemoOptions:
    sessions_dir: Path
    speed: float = 40.0
    kills: int = 2
    seed: int = 7
    report_path: Path | None = None
    timeout: float = 180.0
    flush_interval_seconds: float = 0.2
    log_dir: Path = Path(".turnlog-demo")
    #: a Prometheus file_sd folder: every process gets a metrics port, listed in ``turnlog-demo.json`` there
    #: (tools/demo/scrape_targets.py); None: no metrics ports
    prometheus_targets: Path | None = None


@dataclass(frozen=True, slots=True)
class KillPlan:
    session_id: str  # the session's key (load_sessions)
    input_turn: int
    #: fraction of the turn's real duration after which SIGKILL lands
    at_fraction: float


def choose_kills(
    transcripts: dict[str, list[InputTurn]], count: int, speed: float, flush_interval: float, seed: int
) -> list[KillPlan]:
    """Pick ``count`` sessions and, in each, a turn long enough that at least two
    timer flushes happen before the kill (so an interrupted partial is stored),
    from the middle of the session."""
    rng = random.Random(seed)
    candidates = {}
    for session_id, turns in transcripts.items():
        middle = turns[len(turns) // 5 : len(turns) * 4 // 5]
        long_turns = [t.turn_index for t in middle if (t.end_s - t.start_s) / speed >= 4 * flush_interval]
        if long_turns:
            candidates[session_id] = long_turns
    chosen = rng.sample(sorted(candidates), min(count, len(candidates)))
    return [KillPlan(s, rng.choice(candidates[s]), rng.uniform(0.5, 0.8)) for s in chosen]


class AgentProcess:
    """One agent process and a thread reading its JSON progress lines (``on_line(agent, line)``)."""

    def __init__(self, process: ServiceProcess, on_line: object) -> None:
        self.process = process
        self.lines: list[dict[str, object]] = []
        self._on_line = on_line
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.popen.stdout is not None
        for raw in self.process.popen.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            self.lines.append(line)
            if callable(self._on_line):
                self._on_line(self, line)


def run_demo(settings: TurnlogSettings, options: DemoOptions) -> bool:
    """Run the demo; print the table and verdict; return True when every session is intact."""
    run_id = uuid.uuid4().hex[:8]
    # The run's own spool folder: its resumed agents deliver what its killed ones left there.
    settings = with_run_keys(settings.model_copy(
        update={"flush_interval_seconds": options.flush_interval_seconds,
                "spool_dir": str(options.log_dir / run_id / "spool")}
    ), options.log_dir / run_id)
    transcripts, paths = load_sessions(options.sessions_dir, run_id)
    files = list(paths.values())
    kills = choose_kills(transcripts, options.kills, options.speed, options.flush_interval_seconds, options.seed)
    log_dir = options.log_dir / run_id
    base_time = dt.datetime.now(dt.UTC).replace(microsecond=0)
    print(f"turnlog demo {run_id}: {len(files)} sessions, {sum(map(len, transcripts.values()))} turns, speed"
          f" x{options.speed:g}")

    ensure_local_services(settings)
    store = open_store(settings.database_url)
    print(f"store {store.location}, logs in {log_dir}")
    if settings.kek_public_key:
        print(f"content sealed before the spool with KEK {parse_public_key(settings.kek_public_key).id} (agents hold "
              "its public half only)")
    store.upgrade_schema()
    create_topics(settings)
    started = time.monotonic()
    scrape_targets = ScrapeTargets(options.prometheus_targets, "turnlog-demo")
    services: dict[str, ServiceProcess] = {}
    for service in ("sequencer", "sink", "finalizer"):  # one call each: each its own metrics port
        services |= start_pipeline(settings, log_dir, services=(service,),
                                   extra_env=scrape_targets.environment(service, service))
    lag_exporter = start_lag_exporter(settings, log_dir, scrape_targets)
    if scrape_targets.path is not None:
        print(f"Prometheus targets (every service and agent, and a lag exporter): {scrape_targets.path}")
    agents: list[AgentProcess] = []
    killed: list[dict[str, object]] = []
    lock = threading.Lock()
    env = settings.as_environment()
    env.pop("TURNLOG_KEYRING_FILE", None)  # agents seal with the public KEK and open nothing

    def spawn(key: str, *extra: str) -> AgentProcess:
        argv = turnlog_command(
            "replay-agent", str(paths[key]), *agent_session_options(key), "--speed", str(options.speed),
            "--base-time", base_time.isoformat(), *extra,
        )
        name = f"agent-{key}" + ("-resumed" if extra else "")
        agent_env = env | scrape_targets.environment("agent", key)  # a resumed agent keeps the port
        process = ServiceProcess(name, argv, agent_env, log_dir / f"{name.replace(':', '-')}.log", stdout_pipe=True)
        agent = AgentProcess(process, on_progress)
        with lock:
            agents.append(agent)
        return agent

    plans = {plan.session_id: plan for plan in kills}

    def on_progress(agent: AgentProcess, line: dict[str, object]) -> None:
        if line.get("type") in ("done", "terminated"):  # its session ended: no longer a target
            scrape_targets.remove(agent.process.name.removeprefix("agent-").removesuffix("-resumed"))
        plan = plans.get(agent.process.name.removeprefix("agent-"))
        if plan is None or line.get("type") != "turn" or line.get("input_turn") != plan.input_turn:
            return
        delay = float(line["real_seconds"]) * plan.at_fraction  # type: ignore[arg-type]

        def kill_and_resume() -> None:
            agent.process.kill()
            print(f"  SIGKILL agent of {plan.session_id} (pid {agent.process.pid}) {delay:.2f}s into input turn"
                  f" {plan.input_turn}; resuming in a new process")
            killed.append({"session_id": plan.session_id, "input_turn": plan.input_turn,
                           "after_seconds": round(delay, 3)})
            spawn(plan.session_id, "--resume")

        threading.Timer(delay, kill_and_resume).start()

    try:
        # The agents talk to a running pipeline: each service's ready file (turnlog/readiness.py).
        wait_all_ready(services, PIPELINE_READY_TIMEOUT_SECONDS)
        replay_started = time.monotonic()
        print(f"pipeline ready in {replay_started - started:.1f}s", flush=True)
        for key in transcripts:
            spawn(key)
        _wait_for_agents(agents, lock, len(transcripts) + len(kills), started + options.timeout + 600)
        replay_seconds = time.monotonic() - replay_started
        # An agent that exited while the broker was away left its events in the spool: deliver them.
        spools = asyncio.run(drain_orphaned_spools(settings, SPOOL_DRAIN_TIMEOUT_SECONDS))
        finalized_in = wait_for_finalized(store, list(transcripts), time.monotonic() + options.timeout)
    finally:
        stop_all(services)
        for agent in agents:
            agent.process.stop(5)
        if lag_exporter is not None:
            lag_exporter.stop(5)
        scrape_targets.close()
    wall = time.monotonic() - started

    kills_by_session = {k["session_id"]: 1 for k in killed}
    verdicts = [
        judge_session(store, sid, turns, kills_by_session.get(sid, 0), base_time=base_time)
        for sid, turns in transcripts.items()
    ]
    verdicts_by_id = {v.session_id: v for v in verdicts}
    for plan in kills:
        if plan.session_id not in kills_by_session:
            verdicts_by_id[plan.session_id].problems.append(Problem(ProblemKind.KILL_MISSED, 1,
                                                                    "the planned SIGKILL did not happen"))
    events = count_events(store, list(transcripts))
    failed_agents = [a.process.name for a in agents if a.process.popen.returncode not in (0, -9)]
    ok = all(v.ok for v in verdicts) and not failed_agents and len(killed) == len(kills) and not spools.undelivered
    print_table(verdicts)
    if spools.found:
        print(f"\nspools left by finished agents: {spools.found} events, {spools.undelivered} left undelivered")
    rate = events / wall if wall else 0.0
    print(
        f"\n{events} events in {wall:.1f}s wall ({rate:.0f} events/s end to end; replay {replay_seconds:.1f}s, "
        f"finalized {finalized_in:.1f}s after the last agent); {len(killed)} agents SIGKILLed and resumed"
    )
    if failed_agents:
        print(f"agents that failed: {', '.join(failed_agents)} (logs in {log_dir})")
    print(
        "VERDICT: "
        + (
            "every session intact: all turns stored exactly once, in order, finalized, aggregates equal a recomputation"
            if ok
            else f"FAILED: see the problems above, the service logs in {log_dir} "
            f"(sequencer.log: gaps; sink.log; finalizer.log) and rejected events in {settings.topics.dlq}"
        )
    )
    if options.report_path is not None:
        report = {
            "run_id": run_id,
            "ok": ok,
            "verdict": "intact" if ok else "failed",
            "wall_seconds": round(wall, 3),
            "events": events,
            "events_per_second": round(rate, 1),
            "speed": options.speed,
            "kills": killed,
            "failed_agents": failed_agents,
            "orphaned_spool_events_at_end": spools.found,
            "undelivered_spool_events": spools.undelivered,
            "database": store.location,
            "sessions": [v.as_json() for v in verdicts],
        }
        options.report_path.write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2) + b"\n")
        print(f"report written to {options.report_path}")
    return ok


def start_lag_exporter(
    settings: TurnlogSettings, log_dir: Path, scrape_targets: ScrapeTargets
) -> ServiceProcess | None:
    """``turnlog lag-exporter`` for the run's groups, listed in ``scrape_targets``; None when they are off
    (no Prometheus would read it). It writes no ready file: Prometheus sees it up once it serves."""
    metrics_port = scrape_targets.environment("lag-exporter", "lag-exporter")
    if not metrics_port:
        return None
    return ServiceProcess("lag-exporter", turnlog_command("lag-exporter"), settings.as_environment() | metrics_port,
                          log_dir / "lag-exporter.log")


def load_sessions(folder: Path, run_id: str) -> tuple[dict[str, list[InputTurn]], dict[str, Path]]:
    """The transcripts of ``folder``, and their files, by session key: each file is :data:`DEMO_FLEET`'s
    session ``<file stem>.<run_id>``, whose key (``demo:<file stem>.<run_id>``) the store, the agents'
    latency logs and the run's reports name it by (its agent is given the id: :func:`agent_session_options`).

    Raises:
        ConfigurationError: no transcripts, an unreadable one, one the replay cannot tell turns apart in,
            or one whose file name cannot make a session id.
    """
    transcripts, paths = {}, {}
    for path in find_transcripts(folder):
        turns = load_transcript(path)
        check_replayable(path, turns)
        try:
            key = session_key(DEMO_FLEET, f"{path.stem}.{run_id}")
        except SessionKeyError as e:
            raise ConfigurationError(f"transcript {path}: its file name cannot name a session ({e})") from None
        transcripts[key] = turns
        paths[key] = path
    return transcripts, paths


def agent_session_options(key: str) -> list[str]:
    """The ``turnlog replay-agent`` options that have it record the session keyed ``key`` (a key of
    :func:`load_sessions`): its fleet and the id its agent gives it."""
    return ["--fleet", DEMO_FLEET, "--session-id", local_id(DEMO_FLEET, key)]


def _wait_for_agents(agents: list[AgentProcess], lock: threading.Lock, expected: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        with lock:
            running = [a for a in agents if a.process.alive()]
            count = len(agents)
        if count >= expected and not running:
            return
        time.sleep(POLL_SECONDS)
    raise TimeoutError("agents did not finish in time")


def wait_for_finalized(store: SqlStore, session_ids: list[str], deadline: float) -> float:
    """Poll until every session of ``session_ids`` (their keys) is finalized or the deadline passes;
    returns seconds waited."""
    begun = time.monotonic()
    while time.monotonic() < deadline:
        with store.engine.connect() as conn:
            done = conn.execute(
                select(func.count()).where(sessions.c.id.in_(session_ids), sessions.c.status == SessionStatus.FINALIZED)
            ).scalar_one()
        if done == len(session_ids):
            break
        time.sleep(POLL_SECONDS)
    return time.monotonic() - begun


def count_events(store: SqlStore, session_ids: list[str]) -> int:
    """The events the store holds of the sessions keyed ``session_ids``."""
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).where(session_events.c.session_id.in_(session_ids))).scalar_one()


def print_table(verdicts: list[SessionVerdict]) -> None:
    header = (f"{'session':<30} {'input':>6} {'stored':>6} {'intr':>4} {'status':<10} {'duration s':>10} "
              f"{'events':>7}  problems")
    print("\n" + header)
    print("-" * len(header))
    for v in verdicts:
        duration = f"{v.duration_seconds:.1f}" if v.duration_seconds is not None else "-"
        problems = "; ".join(map(str, v.problems)) or "ok"
        print(f"{v.session_id:<30} {v.input_turns:>6} {v.stored_turns:>6} {v.interrupted_turns:>4} {v.status:<10}"
              f" {duration:>10} {v.events:>7}  {problems}")
