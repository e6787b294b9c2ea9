"""The chaos report's logic (pure, or with a stand-in run): grouping the verdicts' typed
problems, retrying a failed resume, the latency windows of kills, outages and faults, and
continuing every worker a run stopped."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from turnlog.tools.demo import chaos
from turnlog.tools.demo.chaos import SessionProblem, faults, report, tally_problems
from turnlog.tools.demo.chaos.state import _Run
from turnlog.tools.demo.verdict import Problem, ProblemKind, SessionVerdict


def verdict(session_id: str, *problems: Problem) -> SessionVerdict:
    return SessionVerdict(
        session_id=session_id, input_turns=10, stored_turns=10, complete_turns=10, interrupted_turns=0, status="finalized",
        duration_seconds=1.0, expected_duration_seconds=1.0, input_tokens=1, output_tokens=1, events=20, kills=1,
        problems=list(problems),
    )


def test_an_unfinished_session_s_missing_turns_are_not_the_pipeline_s_but_its_duplicates_are():
    # The texts say the opposite of the kinds: grouping must follow the kind alone.
    finished = verdict("a", Problem(ProblemKind.LOST_TURNS, 3, "duplicated"), Problem(ProblemKind.EXTRA_GENERATIONS, 1, "lost"))
    unfinished = verdict(
        "b",
        Problem(ProblemKind.LOST_TURNS, 5, "5 input turns missing"),
        Problem(ProblemKind.NOT_FINALIZED, 1, "status is active"),
        Problem(ProblemKind.DUPLICATED_TURNS, 2, "lost"),
        Problem(ProblemKind.BAD_INTERRUPTED, 1, "1 interrupted turn"),
    )
    tally = tally_problems([finished, unfinished], finished={"a"})
    assert {k: n for k, n in tally.totals.items() if n} == {
        ProblemKind.LOST_TURNS: 3,  # only the finished session's
        ProblemKind.EXTRA_GENERATIONS: 1,
        ProblemKind.DUPLICATED_TURNS: 2,  # counted in every session
        ProblemKind.BAD_INTERRUPTED: 1,
    }
    assert set(tally.totals) == set(ProblemKind)
    assert [(p.session_id, p.problem.kind) for p in tally.listed] == [
        ("a", ProblemKind.EXTRA_GENERATIONS),  # verdict order, then each verdict's own order
        ("b", ProblemKind.BAD_INTERRUPTED),
    ]


def test_a_listed_problem_renders_its_text_and_its_json_from_the_typed_fields():
    listed = SessionProblem("s-1", Problem(ProblemKind.OUT_OF_ORDER, 4, "4 turns out of order"))
    assert str(listed) == "s-1: 4 turns out of order"
    assert listed.as_json() == {"session_id": "s-1", "kind": "out_of_order", "count": 4, "detail": "4 turns out of order"}


def test_no_problems_tally_to_zero_and_nothing_listed():
    tally = tally_problems([verdict("a"), verdict("b")], finished={"a"})
    assert not any(tally.totals.values()) and tally.listed == ()


class StandInRun:
    """What :func:`faults.resume_agent` uses of a run: resume processes whose outcome is scripted."""

    def __init__(self, outcomes: list[str]) -> None:
        self.outcomes = outcomes
        self.settings = SimpleNamespace(resume_timeout_seconds=1.0)
        self.lock = threading.Condition()
        self.agents = {"s": SimpleNamespace(state="killed")}
        self.spawned, self.killed, self.records, self.failed_resumes = [], [], [], []

    def spawn(self, session_id, *extra):
        self.spawned.append(extra)
        self.agents[session_id].state = self.outcomes[len(self.spawned) - 1]  # what the process's lines said
        return SimpleNamespace(process=SimpleNamespace(log_path=f"agent{len(self.spawned)}.log"))

    def kill_process(self, process):
        self.killed.append(process.process.log_path)

    def record(self, entry):
        self.records.append(entry)

    def now(self):
        return 12.5


def test_a_failed_resume_is_retried_and_the_attempt_that_worked_is_recorded(monkeypatch):
    monkeypatch.setattr(faults, "RESUME_RETRY_SECONDS", 0.01)
    run = StandInRun(["failed", "failed", "running"])
    faults.resume_agent(run, "s", 10.0, 2, None)
    assert run.spawned == [("--resume",)] * 3
    assert run.killed == ["agent1.log", "agent2.log"]  # each failed attempt's process, not the one that worked
    [entry] = run.records
    assert entry["resume_attempts"] == 3 and entry["recovery_seconds"] == 2.5 and run.failed_resumes == []


def test_a_resume_that_fails_every_attempt_is_recorded_as_not_recovered(monkeypatch):
    monkeypatch.setattr(faults, "RESUME_RETRY_SECONDS", 0.01)
    run = StandInRun(["failed"] * faults.RESUME_ATTEMPTS)
    faults.resume_agent(run, "s", 10.0, 2, "broker down")
    assert len(run.spawned) == faults.RESUME_ATTEMPTS and len(run.killed) == faults.RESUME_ATTEMPTS
    [entry] = run.records
    assert entry["recovery_seconds"] is None and entry["resume_attempts"] == faults.RESUME_ATTEMPTS
    assert entry["error"] == "every resume attempt failed" and run.failed_resumes == ["s"]


def test_a_schedule_step_that_raises_is_recorded_and_voids_the_run(tmp_path) -> None:
    from pathlib import Path

    from turnlog.settings import load_settings

    sessions = Path(__file__).resolve().parents[2] / "data" / "sessions"
    run = _Run(load_settings(), chaos.ChaosOptions(sessions, log_dir=tmp_path), "step-test", store=None)

    def restart_broker() -> None:
        raise RuntimeError("kafka.sh start failed")

    run.background("service-kills", restart_broker)
    run.background("outage-postgres", lambda: None)
    for thread in run.threads:
        thread.join(10)
    assert run.step_failures == ["service-kills: RuntimeError: kafka.sh start failed"]


def test_each_kill_outage_and_fault_is_a_latency_window_until_it_recovered_and_the_store_caught_up():
    from turnlog.tools.demo.latency import CompletedTurn, StoredTurns

    started = 1000.0
    completed = [CompletedTurn("s", 0, 1010.0, 0.1), CompletedTurn("s", 1, 1030.0, 2.0), CompletedTurn("s", 2, 1050.0, 0.1)]
    stored = StoredTurns()
    stored.observe([("s", 0)], queried_at=1011.0)
    stored.observe([("s", 1)], queried_at=1045.0)  # turn 1 (returned at 1032) stored 13 s after the pause ended
    records = [
        {"at_seconds": 20.0, "action": "fault", "component": "broker pause", "down_seconds": 12.0,
         "lifted_at_seconds": 32.0, "recovery_seconds": 13.0},
        {"at_seconds": 5.0, "action": "SIGKILL", "component": "agent", "during": "two brokers down",
         "recovery_seconds": 40.0},
        {"at_seconds": 48.0, "action": "SIGKILL", "component": "sink", "recovery_seconds": None},  # turn 2 never stored
        {"at_seconds": 30.0, "action": "outage", "component": "postgres outage", "down_seconds": 5.0,
         "lifted_at_seconds": 35.0, "recovery_seconds": 1.0},
    ]
    run = SimpleNamespace(started=started, records=records, completed=completed, stored_turns=stored)

    pause, agent, sink, outage = report._fault_windows(run)

    assert (pause.kind, pause.start, pause.lifted, pause.end, pause.held) == ("broker pause", 1020.0, 1032.0, 1045.0, 12.0)
    assert pause.caught_up == 13.0 and records[0]["caught_up_seconds"] == 13.0
    assert agent.kind == "agent (two brokers down)" and agent.end == 1045.0  # its resume (40 s) outlasted the catch-up
    assert (sink.end, sink.recovered, sink.caught_up) == (None, False, 0.0)  # nothing returned by 1048 was missing
    assert records[2]["caught_up_seconds"] == 0.0
    assert (outage.start, outage.end, outage.caught_up) == (1030.0, 1045.0, 10.0)  # turn 1 stored at 1045
    assert records[0]["overlapped"] == ["postgres outage at 30s"] and records[3]["overlapped"] == ["broker pause at 20s"]
    assert "overlapped" not in records[1]  # an instant kill is not a held fault


def test_a_cluster_fault_is_named_by_its_kind_and_a_worker_pause_by_its_service():
    from turnlog.tools.demo.schedule import PlannedFault

    assert report._fault_label(PlannedFault(1.0, "two_brokers_down", 30.0, 75.0)) == "two brokers down"
    assert report._fault_label(PlannedFault(1.0, "worker_pause", 20.0, 40.0, target="sink")) == "sink pause"


def test_the_end_of_a_run_continues_every_worker_it_stopped(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from tests.support import wait_until

    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        worker.send_signal(signal.SIGSTOP)

        def state() -> str:
            return open(f"/proc/{worker.pid}/stat").read().rsplit(")", 1)[1].split()[0]

        wait_until(lambda: state() == "T", timeout=10, what="the worker stopped")
        run = SimpleNamespace(lock=threading.Condition(), paused_pids={worker.pid, 2**22 + 17}, cluster=None)  # one gone
        faults.release_paused(run)
        wait_until(lambda: state() in ("S", "R"), timeout=10, what="the worker continued")
        assert run.paused_pids == set()
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
