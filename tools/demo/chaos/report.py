"""A chaos run's verdict: every session judged as in the demo (``turnlog.tools.demo.verdict``),
their problems tallied by kind, each kill, outage and fault with its recovery and the latency the
agents felt meanwhile, printed and (with ``report_path``) written as JSON."""

from __future__ import annotations

import statistics
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from turnlog.schemas import SessionStatus
from turnlog.tools.demo.chaos.probes import _watermarks
from turnlog.tools.demo.chaos.state import _Run
from turnlog.tools.demo.latency import CompletedTurn, FaultWindow, KindFigures, figures_by_kind, format_table
from turnlog.tools.demo.runner import count_events, print_table
from turnlog.tools.demo.schedule import CLUSTER_COMPONENTS, COMPONENTS, WORKER_PAUSE, PlannedFault, Schedule
from turnlog.tools.demo.verdict import Problem, ProblemKind, SessionVerdict, judge_session, problem_totals

__all__ = ["SessionProblem", "ProblemTally", "tally_problems", "UNFINISHED_SESSION_KINDS", "FIGURE_KINDS"]

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


# -- labels --
def _label(entry: dict[str, Any]) -> str:
    """A kill's, outage's or fault's kind in the report: its component, and the outage it happened in."""
    return entry["component"] + (f" ({entry['during']})" if entry.get("during") else "")


def _fault_label(fault: PlannedFault) -> str:
    """How the report names a fault's kind: "leader kill", "sink pause", ..."""
    if fault.kind == WORKER_PAUSE:
        return f"{fault.target} pause"
    return fault.kind.replace("_", " ")


# -- the verdict --
@dataclass(slots=True)
class _Findings:
    """What the report says of a run, gathered before any of it is printed (:func:`_findings`)."""

    verdicts: list[SessionVerdict]
    tally: ProblemTally
    #: the sessions whose newest agent never finished (a violation of their own)
    unfinished: list[dict[str, Any]]
    failed_agents: list[str]
    #: the figures printed and written at the top of the JSON report (events, problems by kind, what failed, ...)
    figures: dict[str, Any]
    #: per kind of kill, outage or fault: how many, how many recovered, the median and longest recovery
    recovery: dict[str, dict[str, Any]]
    fault_rows: list[KindFigures]
    not_stored: list[CompletedTurn]
    long_broker_outages: list[dict[str, Any]]
    missing_kinds: list[str]
    #: the components SIGKILLed, and whether they are every component of the mode
    killed: set[str]
    covered: bool
    #: nothing violated, the schedule's own failures aside
    ok: bool


def _report(run: _Run, schedule: Schedule, run_id: str, wall: float) -> bool:
    """Judge every session, print the verdict and the run's figures, and write the JSON report
    (``report_path``); True when nothing was violated."""
    verdicts = [
        judge_session(run.store, sid, turns, run.agent_kills.get(sid, 0), base_time=run.base_time)
        for sid, turns in run.transcripts.items()
    ]
    print_table(verdicts)
    findings = _findings(run, schedule, verdicts)
    _print_findings(run, schedule, findings, wall)
    ok = findings.ok and not run.step_failures
    print("CHAOS VERDICT: " + ("no violations" if ok else "VIOLATIONS: see above"))
    if run.options.report_path is not None:
        _write_report(run, schedule, findings, run_id=run_id, wall=wall, ok=ok)
    return ok


def _findings(run: _Run, schedule: Schedule, verdicts: list[SessionVerdict]) -> _Findings:
    """What the verdict rests on, gathered before anything of it is printed (each record gets its
    catch-up and overlaps here, :func:`_fault_windows`)."""
    settings = run.settings
    problems = [p for v in verdicts for p in v.problems]
    finished = {sid for sid, agent in run.agents.items() if agent.state == "done"}
    tally = tally_problems(verdicts, finished)
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
    figures = _figures(run, tally, unfinished, failed_agents)
    recovery_figures = _recovery_figures(run.records)
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
    return _Findings(
        verdicts=verdicts, tally=tally, unfinished=unfinished, failed_agents=failed_agents, figures=figures,
        recovery=recovery_figures, fault_rows=fault_rows, not_stored=not_stored,
        long_broker_outages=long_broker_outages, missing_kinds=missing_kinds, killed=killed, covered=covered, ok=ok,
    )


def _figures(
    run: _Run, tally: ProblemTally, unfinished: list[dict[str, Any]], failed_agents: list[str]
) -> dict[str, Any]:
    """The run's figures: events sent and stored, the problems summed by kind, and what failed."""
    settings, totals = run.settings, tally.totals
    events_sent = _watermarks(settings, settings.topics.events)
    stored = count_events(run.store, list(run.transcripts))
    return {
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


def _recovery_figures(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind (:func:`_label`), in its order: how many, how many recovered, the median and longest recovery."""
    recovery: dict[str, dict[str, Any]] = {}
    for entry in records:
        label = _label(entry)
        recovery.setdefault(label, {"count": 0, "times": []})
        recovery[label]["count"] += 1
        if entry.get("recovery_seconds") is not None:
            recovery[label]["times"].append(entry["recovery_seconds"])
    return {
        label: {
            "count": r["count"],
            "recovered": len(r["times"]),
            "median_seconds": round(statistics.median(r["times"]), 2) if r["times"] else None,
            "max_seconds": round(max(r["times"]), 2) if r["times"] else None,
        }
        for label, r in sorted(recovery.items())
    }


def _print_findings(run: _Run, schedule: Schedule, findings: _Findings, wall: float) -> None:
    """Print the run's figures, then every violation, recovery and note the verdict rests on."""
    figures = findings.figures
    print(f"\n{len(run.records)} kills and outages in {wall:.0f}s; events sent {figures['events_sent']}, stored"
          f" {figures['events_stored']}")
    for key in ("lost_beyond_bound", "duplicated", "altered", "out_of_order", "wrong_aggregates"):
        print(f"  {key}: {figures[key]}")
    for session in findings.unfinished:
        print(
            f"  unfinished: {session['session_id']}: its agent is {session['agent']}, "
            f"{session['input_turns_not_recorded']} input turns never recorded, status {session['status']}"
        )
    for listed in findings.tally.listed:
        print(f"  problem: {listed}")
    for line in findings.failed_agents:
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
    for label, figure in findings.recovery.items():
        median = "-" if figure["median_seconds"] is None else f"{figure['median_seconds']:.2f}s"
        longest = "-" if figure["max_seconds"] is None else f"{figure['max_seconds']:.2f}s"
        print(f"  recovery {label:<22} {figure['recovered']:>2}/{figure['count']:<2} median {median:>8}  max"
              f" {longest:>8}")
    not_stored = findings.not_stored
    for turn in not_stored[:20]:
        print(f"  ACKNOWLEDGED, NOT STORED: {turn.session_id} turn {turn.turn_index} (complete_turn returned at"
              f" {turn.returned - run.started:.1f}s)")
    if len(not_stored) > 20:
        print(f"  ... {len(not_stored)} acknowledged turns not stored in all")
    if run.cluster is None and not findings.long_broker_outages:
        print(f"  no broker outage of at least {run.settings.delivery_timeout_seconds + 30:.0f}s happened")
    for kind in findings.missing_kinds:
        print(f"  no {kind} happened")
    for entry in sorted(run.records, key=lambda e: e["at_seconds"]):
        if entry.get("overlapped"):
            print(f"  {_label(entry)} at {entry['at_seconds']:.0f}s overlapped: {', '.join(entry['overlapped'])}")
    print(f"\ncomplete_turn latency per fault kind ({len(run.completed)} calls; from each fault's start until it"
          " recovered) and catch-up (from the fault's end until the store held every turn completed by then):")
    print(format_table(findings.fault_rows))
    if not findings.covered:
        print(f"  note: SIGKILLs hit {sorted(findings.killed)}, not every component ({len(run.skipped)} skipped,"
              f" {len(schedule.dropped)} dropped for room)")
    for failure in run.step_failures:
        print(f"  SCHEDULE STEP FAILED (the run is void): {failure}")


def _write_report(run: _Run, schedule: Schedule, findings: _Findings, *, run_id: str, wall: float, ok: bool) -> None:
    """The JSON report at ``report_path``."""
    options, settings = run.options, run.settings
    assert options.report_path is not None
    report = {
        "run_id": run_id, "ok": ok, "kills_cover_every_component": findings.covered, "seed": options.seed,
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
        **findings.figures, "recovery": findings.recovery, "schedule": schedule.as_json(),
        "faults_by_kind": [row.as_json() for row in findings.fault_rows],
        "fault_kinds_missing": findings.missing_kinds,
        "acknowledged_not_stored_turns": [
            {"session_id": t.session_id, "turn_index": t.turn_index,
             "returned_at_seconds": round(t.returned - run.started, 2)}
            for t in findings.not_stored
        ],
        "service_workers": run.components,
        "kills": sorted(run.records, key=lambda e: e["at_seconds"]), "skipped": run.skipped,
        "sessions": [v.as_json() for v in findings.verdicts], "schedule_step_failures": run.step_failures,
    }
    options.report_path.write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2) + b"\n")


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
