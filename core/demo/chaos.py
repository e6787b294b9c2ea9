"""``turnlog chaos``: the demo workload under random SIGKILLs of every component.

For ``duration`` seconds the real transcripts are replayed (time-compressed so
they span the run) while a seeded schedule SIGKILLs, in turn, agents (then
resumed in a new process), the sequencer, the sink, the finalizer and the
Kafka broker, and restarts each. Afterwards every session is judged as in the
demo, and the report gives events sent, stored, lost beyond the bound,
duplicated, out of order, wrong aggregates, and the recovery time of each kill.

Recovery time is measured from the SIGKILL until the component works again: a
resumed agent's first line, a replacement sequencer or finalizer joined and
ready, a replacement sink storing (or caught up), a broker answering.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import signal
import statistics
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import msgspec
from confluent_kafka import Consumer, TopicPartition
from sqlalchemy import func, select

from turnlog.demo.runner import AgentProcess, count_events, load_sessions, print_table, wait_for_finalized
from turnlog.demo.verdict import ProblemKind, judge_session, problem_totals
from turnlog.deploy.local import SCRIPTS, ensure_local_services, wait_for_broker
from turnlog.deploy.processes import ServiceProcess, start_pipeline, stop_all, turnlog_command
from turnlog.deploy.topics import create_topics
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.sinks.tables import sink_offsets

__all__ = ["ChaosOptions", "run_chaos", "COMPONENTS"]

logger = logging.getLogger(__name__)
COMPONENTS = ("agent", "sequencer", "sink", "finalizer", "broker")
RECOVERY_TIMEOUT_SECONDS = 120.0
RESUME_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class ChaosOptions:
    sessions_dir: Path
    duration: float = 300.0
    seed: int = 1
    kills: int = 25
    report_path: Path | None = None
    flush_interval_seconds: float = 0.2
    log_dir: Path = Path(".turnlog-chaos")
    state_dir: Path = Path(os.environ.get("TURNLOG_STATE_DIR", Path.home() / ".cache" / "turnlog"))


def run_chaos(base: TurnlogSettings, options: ChaosOptions) -> bool:
    """Run the chaos schedule; print and optionally write the report; True when nothing was violated."""
    rng = random.Random(options.seed)
    run_id = uuid.uuid4().hex[:8]
    # Its own topics and groups, so the run starts clean and never touches other runs' data.
    settings = base.model_copy(
        update={
            "flush_interval_seconds": options.flush_interval_seconds,
            "topic_prefix": f"chaos-{run_id}",
            "sequencer_group": f"chaos-{run_id}-sequencer",
            "sink_group": f"chaos-{run_id}-sink",
            "finalizer_group": f"chaos-{run_id}-finalizer",
            "faust_data_dir": str(options.log_dir / run_id / "faust"),
        }
    )
    log_dir = options.log_dir / run_id
    transcripts, paths = load_sessions(options.sessions_dir, run_id)
    files = list(paths.values())
    longest = max(max(t.end_s for t in turns) - turns[0].start_s for turns in transcripts.values())
    speed = longest / (options.duration * 0.85)
    base_time = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    ensure_local_services(settings)
    store = open_store(settings.database_url)
    upgrade_to_head(store.engine)
    create_topics(settings)
    print(f"turnlog chaos {run_id}: {len(files)} sessions, speed x{speed:.1f}, {options.duration:.0f}s, seed {options.seed}, logs in {log_dir}")

    env = settings.as_environment()
    services = start_pipeline(settings, log_dir)
    agents: dict[str, AgentProcess] = {}
    progress: dict[str, dict[str, object]] = defaultdict(dict)  # session -> newest progress line
    resumed = threading.Condition()
    generation = defaultdict(int)
    lock = threading.Lock()

    resumed_generation: dict[str, int] = {}  # session -> newest agent generation that has resumed

    def on_line(agent: AgentProcess, line: dict[str, object]) -> None:
        name, session_id = agent.process.name.split(":", 1)
        with resumed:
            progress[session_id] = line
            if line.get("type") == "resumed":
                resumed_generation[session_id] = int(name.removeprefix("agent"))
            resumed.notify_all()

    def spawn(session_id: str, *extra: str) -> None:
        with lock:
            generation[session_id] += 1
            name = f"agent{generation[session_id]}:{session_id}"
        argv = turnlog_command(
            "replay-agent", str(paths[session_id]), "--session-id", session_id, "--speed", f"{speed:.4f}",
            "--base-time", base_time.isoformat(), *extra,
        )
        process = ServiceProcess(name, argv, env, log_dir / f"{name.replace(':', '-')}.log", stdout_pipe=True)
        agents[session_id] = AgentProcess(process, on_line)

    started = time.monotonic()
    for session_id in transcripts:
        spawn(session_id)

    kills: list[dict[str, object]] = []
    agent_kills: dict[str, int] = defaultdict(int)
    order = [c for _ in range(options.kills // len(COMPONENTS) + 1) for c in rng.sample(COMPONENTS, len(COMPONENTS))][: options.kills]
    interval = options.duration * 0.8 / max(len(order), 1)
    try:
        for number, component in enumerate(order):
            _sleep_until(started + (number + 0.5) * interval)
            began = time.monotonic()
            if component == "agent":
                running = sorted(s for s, a in agents.items() if a.process.alive() and progress[s].get("type") == "turn")
                if not running:
                    continue
                session_id = rng.choice(running)
                agents[session_id].process.kill()
                agent_kills[session_id] += 1
                with resumed:
                    progress[session_id] = {}
                for attempt in range(RESUME_ATTEMPTS):  # an operator (or supervisor) retries a failed resume
                    spawn(session_id, "--resume")
                    agent = agents[session_id]
                    with resumed:
                        resumed.wait_for(
                            lambda: resumed_generation.get(session_id) == generation[session_id] or not agent.process.alive(),
                            timeout=RECOVERY_TIMEOUT_SECONDS,
                        )
                    if resumed_generation.get(session_id) == generation[session_id]:
                        break
                    logger.warning("resume of %s failed (attempt %d); see %s", session_id, attempt + 1, agent.process.log_path)
                target = session_id
            elif component == "broker":
                target = _kill_broker(options.state_dir)
                wait_for_broker(settings.bootstrap_servers, timeout=RECOVERY_TIMEOUT_SECONDS)
            else:
                services[component].kill()
                before = _sink_progress(store, settings) if component == "sink" else None
                old_log = services[component].log_path
                services[component] = ServiceProcess(
                    component, turnlog_command(component), env, old_log.with_name(f"{component}-{number}.log")
                )
                target = f"pid {services[component].pid}"
                if component == "sink":
                    # progress, or nothing left to do (caught up with the transcript)
                    pending = _watermarks(settings, settings.topics.transcript)
                    _wait_until(lambda: _sink_progress(store, settings) > min(before, pending - 1), RECOVERY_TIMEOUT_SECONDS)
                else:
                    log = services[component].log_path
                    _wait_until(lambda: "[^Worker]: Ready" in log.read_text(errors="replace"), RECOVERY_TIMEOUT_SECONDS)
            recovery = time.monotonic() - began
            kills.append({"at_seconds": round(began - started, 1), "component": component, "target": target, "recovery_seconds": round(recovery, 2)})
            print(f"  {began - started:6.1f}s SIGKILL {component:<9} {target}: recovered in {recovery:.2f}s")
        _wait_agents(agents, started + options.duration * 3)
        wait_for_finalized(store, list(transcripts), time.monotonic() + RECOVERY_TIMEOUT_SECONDS * 2)
    finally:
        stop_all(services)
        for agent in agents.values():
            agent.process.stop(5)
    wall = time.monotonic() - started

    verdicts = [
        judge_session(store, sid, turns, agent_kills.get(sid, 0), base_time=base_time) for sid, turns in transcripts.items()
    ]
    print_table(verdicts)
    problems = [p for v in verdicts for p in v.problems]
    totals = problem_totals(problems)
    counted = {ProblemKind.LOST_TURNS, ProblemKind.DUPLICATED_TURNS, ProblemKind.ALTERED_TURNS, ProblemKind.OUT_OF_ORDER, ProblemKind.WRONG_AGGREGATE}
    events_sent = _events_sent(settings)
    stored = count_events(store, list(transcripts))
    figures = {
        "events_sent": events_sent,
        "events_stored": stored,
        "lost_beyond_bound": totals[ProblemKind.LOST_TURNS],
        "duplicated": totals[ProblemKind.DUPLICATED_TURNS],
        "altered": totals[ProblemKind.ALTERED_TURNS],
        "out_of_order": totals[ProblemKind.OUT_OF_ORDER],
        "wrong_aggregates": totals[ProblemKind.WRONG_AGGREGATE],
        "other_problems": [str(p) for p in problems if p.kind not in counted],
    }
    recovery = {
        component: {
            "kills": len(times),
            "median_seconds": round(statistics.median(times), 2),
            "max_seconds": round(max(times), 2),
        }
        for component in COMPONENTS
        if (times := [k["recovery_seconds"] for k in kills if k["component"] == component])
    }
    ok = not problems and all(v.status == "finalized" for v in verdicts)
    covered = len(kills) >= min(options.kills, 20) and set(recovery) == set(COMPONENTS)
    print(f"\n{len(kills)} kills in {wall:.0f}s; events sent {events_sent}, stored {stored}")
    for key in ("lost_beyond_bound", "duplicated", "out_of_order", "wrong_aggregates"):
        print(f"  {key}: {figures[key]}")
    for component, figure in recovery.items():
        print(f"  recovery {component:<9} kills {figure['kills']:>2}  median {figure['median_seconds']:.2f}s  max {figure['max_seconds']:.2f}s")
    if not covered:
        print(f"  note: {len(kills)} kills over {sorted(recovery)}: fewer than planned (no agent was mid-turn at some slots)")
    print("CHAOS VERDICT: " + ("no violations" if ok else "VIOLATIONS: see above"))
    if options.report_path is not None:
        report = {"run_id": run_id, "ok": ok, "kills_cover_every_component": covered, "seed": options.seed, "duration_seconds": options.duration, "wall_seconds": round(wall, 1),
                  "speed": round(speed, 2), **figures, "recovery": recovery, "kills": kills, "sessions": [v.as_json() for v in verdicts]}
        options.report_path.write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2) + b"\n")
    return ok


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _wait_until(probe: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    logger.error("a component did not recover within %.0f s", timeout)
    return False


def _kill_broker(state_dir: Path) -> str:
    pid = int((state_dir / "kafka" / "kafka.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: not Path(f"/proc/{pid}").exists(), 30)
    subprocess.run(["bash", str(SCRIPTS / "kafka.sh"), "start"], check=True, capture_output=True)
    return f"pid {pid}"


def _watermarks(settings: TurnlogSettings, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": f"chaos-probe-{uuid.uuid4()}"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in range(settings.partitions))
    except Exception:  # the broker may be restarting; "no progress yet"
        return -1
    finally:
        consumer.close()


def _sink_progress(store: object, settings: TurnlogSettings) -> int:
    try:
        with store.engine.connect() as conn:  # type: ignore[attr-defined]
            return conn.execute(
                select(func.coalesce(func.sum(sink_offsets.c.next_offset), 0)).where(sink_offsets.c.consumer_group == settings.sink_group)
            ).scalar_one()
    except Exception:
        return -1


def _events_sent(settings: TurnlogSettings) -> int:
    return _watermarks(settings, settings.topics.events)


def _wait_agents(agents: dict[str, AgentProcess], deadline: float) -> None:
    while time.monotonic() < deadline:
        if not any(a.process.alive() for a in agents.values()):
            return
        time.sleep(0.5)
    raise TimeoutError("agents did not finish in time")
