"""What a chaos run does to the agents, the pipeline's workers and the shared broker and Postgres,
and how it tells each came back: an agent SIGKILLed mid-turn and resumed in a new process, a
service worker SIGKILLed and replaced, a broker SIGKILLed and restarted, an outage of the broker or
Postgres, a worker SIGSTOPped past its group's session timeout. Each is recorded with its recovery
time (:meth:`_Run.record`). The cluster's broker faults are in ``cluster.py``."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import time
from typing import Any

from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_fixed

from turnlog.tools.demo.chaos.options import RECOVERY_TIMEOUT_SECONDS
from turnlog.tools.demo.chaos.probes import (
    _broker_answers,
    _group_rejoined,
    _held_within,
    _sink_moved,
    _sink_progress,
)
from turnlog.tools.demo.chaos.report import _fault_label
from turnlog.tools.demo.chaos.shared_services import _kill_broker, _script, _stop_postgres
from turnlog.tools.demo.chaos.state import _Run
from turnlog.tools.demo.chaos.watch import wait_caught_up
from turnlog.tools.demo.schedule import PlannedFault, PlannedKill, PlannedOutage

__all__ = ["kill_agent", "resume_agent", "run_service_kills", "kill_service", "run_outage", "run_worker_pause",
           "release_paused", "RESUME_ATTEMPTS", "RESUME_RETRY_SECONDS"]

logger = logging.getLogger(__name__)
RESUME_ATTEMPTS = 4
#: Between a failed resume attempt and the next (seconds).
RESUME_RETRY_SECONDS = 2.0
LATEST_SERVICE_KILL = 1.5  # a service kill held up past this (fraction of ``duration``) is skipped


# -- agents --
def kill_agent(run: _Run, during: str | None) -> None:
    """SIGKILL an agent that has a turn open, and resume its session in a new process (in the background)."""
    at = run.now()
    with run.lock:
        candidates = sorted(
            sid for sid, a in run.agents.items()
            if a.state == "running" and a.open_turns > 0 and a.process is not None and a.process.process.alive()
        )
        if not candidates:
            run.skipped.append({"at_seconds": round(at, 1), "component": "agent", "during": during,
                                "why": "no agent was mid-turn"})
            print(f"  {at:6.1f}s skip    agent: none mid-turn")
            return
        session_id = run.rng.choice(candidates)
        agent = run.agents[session_id]
        agent.state = "killed"
        open_turns = agent.open_turns
        process = agent.process
    assert process is not None
    run.kill_process(process)
    run.agent_kills[session_id] += 1
    run.background(f"resume-{session_id}", resume_agent, run, session_id, at, open_turns, during)


def resume_agent(run: _Run, session_id: str, killed_at: float, open_turns: int, during: str | None) -> None:
    """Resume in a new process, retrying a failed attempt (an operator or a supervisor would):
    up to ``RESUME_ATTEMPTS`` processes, ``RESUME_RETRY_SECONDS`` apart."""
    timeout = run.settings.resume_timeout_seconds + 60.0
    numbers = itertools.count(1)

    def attempt() -> int | None:
        """One resume process: its attempt number if it resumed; None if it failed (it is killed)."""
        number = next(numbers)
        process = run.spawn(session_id, "--resume")
        with run.lock:
            run.lock.wait_for(lambda: run.agents[session_id].state != "resuming", timeout=timeout)
            state = run.agents[session_id].state
        if state in ("running", "done"):
            return number
        logger.warning("resume of %s failed (attempt %d, %s); see %s", session_id, number, state,
                       process.process.log_path)
        run.kill_process(process)
        return None

    retrying = Retrying(
        retry=retry_if_result(lambda number: number is None),
        stop=stop_after_attempt(RESUME_ATTEMPTS),
        wait=wait_fixed(RESUME_RETRY_SECONDS),
        retry_error_callback=lambda _: None,
    )
    resumed_at_attempt = retrying(attempt)
    if resumed_at_attempt is not None:
        run.record({
            "at_seconds": round(killed_at, 1), "action": "SIGKILL", "component": "agent", "target": session_id,
            "during": during, "open_turns": open_turns, "resume_attempts": resumed_at_attempt,
            "recovery_seconds": round(run.now() - killed_at, 2),
        })
        return
    with run.lock:
        run.failed_resumes.append(session_id)
    run.record({
        "at_seconds": round(killed_at, 1), "action": "SIGKILL", "component": "agent", "target": session_id,
        "during": during, "open_turns": open_turns, "resume_attempts": RESUME_ATTEMPTS, "recovery_seconds": None,
        "error": "every resume attempt failed",
    })


# -- services --
def run_service_kills(run: _Run, kills: list[PlannedKill]) -> None:
    for planned in kills:
        run.sleep_until(planned.at)
        kill_service(run, planned)


def kill_service(run: _Run, planned: PlannedKill) -> None:
    run.brokers_whole.wait()  # a replacement cannot join a group while two brokers are down
    with run.service_lock:
        at = run.now()
        if at > LATEST_SERVICE_KILL * run.options.duration:
            run.skipped.append({"at_seconds": round(at, 1), "component": planned.component,
                                "why": "too late (an outage or a recovery ran long)"})
            print(f"  {at:6.1f}s skip    {planned.component}: too late")
            return
        began = time.monotonic()
        error = None
        if planned.component == "broker":
            with run.our("broker"):
                target = _kill_broker(run.options.state_dir)
                _script("kafka.sh", "start")
            recovered = _held_within(lambda: _broker_answers(run.settings), RECOVERY_TIMEOUT_SECONDS,
                                     "the broker to answer")
        else:
            component = planned.component
            groups = {"sequencer": run.settings.sequencer_group, "finalizer": run.settings.finalizer_group}
            group = groups.get(component)
            probe = run.group_probe
            members: frozenset[str] = frozenset()
            if group is not None:  # who is in the group before the kill (the broker may still be settling)
                _held_within(lambda: bool(probe.members(group)[1]), 30.0, f"members in group {group}", every=0.5)
                members = probe.members(group)[1]
            before = _sink_progress(run.store, run.settings) if component == "sink" else 0
            with run.services_lock:
                workers = run.workers_of(component)
                worker = workers[0] if len(workers) == 1 else run.fault_rng.choice(workers)
                killed = run.services[worker].pid
                run.services[worker].kill()
                run.services[worker] = run.start_service(component, f"{worker}-{int(at)}", worker)
                target = f"pid {killed} (replaced by pid {run.services[worker].pid})"
                if len(workers) > 1:
                    target = f"{worker} {target}"
            if group is not None:
                recovered = _held_within(lambda: _group_rejoined(probe, group, members), RECOVERY_TIMEOUT_SECONDS,
                                         f"the {component} to rejoin group {group}", every=0.5)
            else:
                recovered = _held_within(lambda: _sink_moved(run.store, run.settings, before),
                                         RECOVERY_TIMEOUT_SECONDS, "the sink to store again", every=0.5)
        if not recovered:
            error = f"not recovered within {RECOVERY_TIMEOUT_SECONDS:.0f}s"
            if planned.component in ("sequencer", "finalizer"):
                error += f" (the group's last description: {run.group_probe.last_answer})"
        run.record({
            "at_seconds": round(at, 1), "action": "SIGKILL", "component": planned.component, "target": target,
            "recovery_seconds": round(time.monotonic() - began, 2) if recovered else None,
            **({"error": error} if error else {}),
        })


def run_outage(run: _Run, planned: PlannedOutage) -> None:
    run.brokers_whole.wait()
    with run.service_lock:
        at = run.now()
        before = _sink_progress(run.store, run.settings)
        with run.lock:
            run.outage = planned.service  # before the kill: an agent killed from now on is killed during it
        with run.our(planned.service):
            if planned.service == "broker":
                target = _kill_broker(run.options.state_dir)
            else:
                target = _stop_postgres(run.options.state_dir, planned.method)
        began = run.started + at
        with run.lock:
            run.down_by_us.add(planned.service)
        for offset in planned.agent_kills:
            run.sleep_until(at + offset)
            kill_agent(run, during=f"{planned.service} down")
        run.sleep_until(at + planned.down_seconds)
        restart = time.monotonic()
        down = restart - began
        with run.our(planned.service):
            with run.lock:
                run.down_by_us.discard(planned.service)
            _script("kafka.sh" if planned.service == "broker" else "postgres.sh", "start")
        if planned.service == "broker":
            answered = _held_within(lambda: _broker_answers(run.settings), RECOVERY_TIMEOUT_SECONDS,
                                    "the broker to answer")
        else:
            answered = _held_within(run.store.answers, RECOVERY_TIMEOUT_SECONDS,
                                    "the database to answer")
        answered_at = time.monotonic()
        with run.lock:
            run.outage = None
        flowing = answered and _held_within(lambda: _sink_moved(run.store, run.settings, before),
                                            RECOVERY_TIMEOUT_SECONDS, "the sink to store again", every=0.5)
        entry = {
            "at_seconds": round(at, 1), "action": "outage", "component": f"{planned.service} outage",
            "target": f"{target} ({planned.method})", "down_seconds": round(down, 1),
            "lifted_at_seconds": round(restart - run.started, 1),
            "restart_seconds": round(answered_at - restart, 2),
            "recovery_seconds": round(time.monotonic() - restart, 2) if flowing else None,
            "agents_killed_meanwhile": len(planned.agent_kills),
        }
        if not flowing:
            entry["error"] = "the pipeline did not store again in time"
        run.record(entry)


# -- worker pauses --
def run_worker_pause(run: _Run, planned: PlannedFault) -> None:
    """SIGSTOP one worker of ``planned.target`` for its hold, past its group's session timeout, then SIGCONT."""
    run.brokers_whole.wait()
    with run.service_lock:
        at = run.now()
        with run.services_lock:
            worker = run.fault_rng.choice(run.workers_of(planned.target))
            process = run.services[worker]
            with run.lock:
                run.paused_pids.add(process.pid)
            process.popen.send_signal(signal.SIGSTOP)
        try:
            run.sleep_until(at + planned.hold_seconds)
        finally:
            lifted = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
            with run.lock:
                run.paused_pids.discard(process.pid)
        caught_up = wait_caught_up(run, lifted, RECOVERY_TIMEOUT_SECONDS)
        entry: dict[str, Any] = {
            "at_seconds": round(at, 1), "action": "SIGSTOP", "component": _fault_label(planned),
            "target": f"{worker} pid {process.pid}", "down_seconds": round(lifted - run.started - at, 1),
            "lifted_at_seconds": round(lifted - run.started, 1),
            "recovery_seconds": round(caught_up, 2) if caught_up is not None else None,
            "alive_after": process.alive(),
        }
        if caught_up is None:
            entry["error"] = f"the pipeline did not catch up within {RECOVERY_TIMEOUT_SECONDS:.0f}s"
        run.record(entry)


def release_paused(run: _Run) -> None:
    """SIGCONT every worker and node this run SIGSTOPped and has not continued (at the end, whatever happened)."""
    with run.lock:
        pids, run.paused_pids = set(run.paused_pids), set()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    if run.cluster is not None:
        run.cluster.resume_all()
