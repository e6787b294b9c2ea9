"""Run the test suite tier by tier, as ``bash deploy/dev.sh test`` does, then print how long each
tier took and the slowest tests.

    python -m tests.tiers [--only TIER ...] [--workers N] [--reports DIR] [pytest options...]

The tiers, in the order they run:

- ``unit``: ``tests/unit``. Nothing but ``pip install -e '.[test]'``: no service, no root, no browser.
- ``external_tools``: ``tests/external_tools``. Programs outside Python: promtool, Node.js.
- ``services``: ``tests/crash``, ``tests/integration`` and ``tests/adapters`` on ``--workers``
  pytest-xdist workers, a file to a worker (``--dist loadfile``: a module's shared pipeline starts
  once). They mostly wait: on the broker, Postgres, real-time audio, a killed process's successor.
  Each test makes its own topics (a random prefix), consumer groups and Postgres database, so
  workers never share state.
- ``cluster``: ``tests/cluster``, in one process beside ``services``: its tests share the 3-node
  cluster that process starts once.
- ``outages``: the tests marked ``outage``, one after the other. They stop or SIGKILL the shared
  broker and Postgres, so they run beside the tiers that use neither (``unit``, ``external_tools``)
  and never beside one that does.
- ``adapter_floors``: ``deploy/adapter_floors.sh``, the adapter tests on each framework's oldest
  release in venvs of their own, last; ``floor_venvs`` builds those venvs earlier, beside ``outages``.

The tiers of a stage (``STAGES``) run side by side; each one's output is printed whole when it ends.
Every tier runs even when an earlier one failed; the exit code is 1 if any failed. Each tier writes
JUnit XML reports (``DIR/<tier>*.xml``); the summary at the end, read from them, gives each tier's
wall time, each folder's summed test time and the slowest tests. No test fails on a time: the
figures are for people.
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLOWEST_SHOWN = 25


@dataclass(frozen=True)
class Tier:
    name: str
    paths: tuple[str, ...] = ()
    options: tuple[str, ...] = ()  # pytest options of the tier
    parallel: bool = False  # on --workers pytest-xdist workers, a group per file (tests/conftest.py)
    command: tuple[str, ...] = ()  # a tier run by a script rather than by one pytest


SERVICE_FOLDERS = ("tests/crash", "tests/integration", "tests/adapters")  # the longest files first

UNIT = Tier("unit", ("tests/unit",))
EXTERNAL_TOOLS = Tier("external_tools", ("tests/external_tools",))
OUTAGES = Tier("outages", SERVICE_FOLDERS, ("-m", "outage"))
SERVICES = Tier("services", SERVICE_FOLDERS, ("-m", "not outage"), parallel=True)
CLUSTER = Tier("cluster", ("tests/cluster",))
FLOOR_VENVS = Tier("floor_venvs", command=("bash", "deploy/adapter_floors.sh", "--build"))  # pip only, no test
ADAPTER_FLOORS = Tier("adapter_floors", command=("bash", "deploy/adapter_floors.sh"))
TIERS = (UNIT, EXTERNAL_TOOLS, OUTAGES, FLOOR_VENVS, SERVICES, CLUSTER, ADAPTER_FLOORS)
# Side by side within a stage, stage after stage: the outages never overlap a tier of the shared services,
# and the floors' venvs are built while the outages mostly wait.
# The floors run after services and cluster: beside them, the CPU they took made real-time tests
# (LiveKit's audio turns, a recorder's broker acknowledgements) miss their timing.
STAGES = ((OUTAGES, UNIT, EXTERNAL_TOOLS, FLOOR_VENVS), (CLUSTER, SERVICES), (ADAPTER_FLOORS,))


@dataclass
class CaseResult:
    node: str  # path::name, as pytest names it
    seconds: float  # setup, call and teardown
    outcome: str  # passed, failed, error, skipped


@dataclass
class TierRun:
    tier: Tier
    seconds: float
    exit_code: int
    cases: list[CaseResult] = field(default_factory=list)


def read_junit(path: Path) -> list[CaseResult]:
    """The test cases of a JUnit XML report written by pytest (``--junitxml``)."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        # A module skipped at collection has no classname: its name is the module.
        module = (case.get("classname") or case.get("name", "")).replace(".", "/")
        # classname is "tests.unit.test_x" or "tests.unit.test_x.TestClass": the file is the longest
        # prefix that exists.
        parts = module.split("/")
        file = module + ".py"
        for end in range(len(parts), 0, -1):
            candidate = "/".join(parts[:end]) + ".py"
            if (ROOT / candidate).exists():
                file = candidate + "".join(f"::{p}" for p in parts[end:])
                break
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
        name = case.get("name", "")
        node = file if not case.get("classname") else f"{file}::{name}"
        cases.append(CaseResult(node, float(case.get("time", 0.0)), outcome))
    return cases


@dataclass
class StartedTier:
    tier: Tier
    argv: list[str]
    output: Path
    process: subprocess.Popen[bytes]
    started: float


def start_tier(tier: Tier, reports: Path, workers: int, pytest_args: Sequence[str]) -> StartedTier:
    for old in reports.glob(f"{tier.name}*.xml"):
        old.unlink()
    env = {**os.environ, "TURNLOG_TEST_REPORTS": str(reports)}
    if tier.command:
        argv = list(tier.command)
    else:
        argv = [sys.executable, "-m", "pytest", *tier.paths, *tier.options, f"--junitxml={reports / tier.name}.xml",
                *pytest_args]
        if tier.parallel and workers > 1:
            argv += ["-n", str(workers), "--dist", "loadfile"]
    print(f"=== tier {tier.name} started: {' '.join(argv)}", flush=True)
    output = reports / f"{tier.name}.log"
    with output.open("wb") as sink:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return StartedTier(tier, argv, output, process, time.monotonic())


def finish_tier(started: StartedTier, reports: Path) -> TierRun:
    exit_code = started.process.wait()
    seconds = time.monotonic() - started.started
    print(f"\n=== tier {started.tier.name}: {' '.join(started.argv)}", flush=True)
    sys.stdout.buffer.write(started.output.read_bytes())
    print(f"=== tier {started.tier.name} ended: exit {exit_code} after {seconds:.0f} s", flush=True)
    cases = [case for report in sorted(reports.glob(f"{started.tier.name}*.xml")) for case in read_junit(report)]
    return TierRun(started.tier, seconds, exit_code, cases)


def run_stage(tiers: Sequence[Tier], reports: Path, workers: int, pytest_args: Sequence[str]) -> list[TierRun]:
    """Start the tiers side by side; wait for each, printing its output whole as it ends."""
    ended: queue.Queue[StartedTier] = queue.Queue()
    for tier in tiers:
        started = start_tier(tier, reports, workers, pytest_args)
        threading.Thread(target=lambda t=started: (t.process.wait(), ended.put(t)), daemon=True).start()
    return [finish_tier(ended.get(), reports) for _ in tiers]


def summary(runs: Sequence[TierRun], elapsed: float) -> str:
    """The time of each tier (wall clock, and the sum of its tests' own times), of the whole run
    (``elapsed`` s: tiers of a stage overlap, so it is less than their sum) and the slowest tests."""
    lines = ["", "=== test time per tier", f"{'tier':<16} {'wall s':>8} {'tests':>6} {'sum of tests s':>15}  result"]
    for run in runs:
        failed = sum(case.outcome in ("failed", "error") for case in run.cases)
        result = "ok" if run.exit_code == 0 else f"FAILED (exit {run.exit_code}, {failed} failed)"
        lines.append(f"{run.tier.name:<16} {run.seconds:>8.0f} {len(run.cases):>6} "
                     f"{sum(c.seconds for c in run.cases):>15.0f}  {result}")
    lines.append(f"{'all (elapsed)':<16} {elapsed:>8.0f} {sum(len(run.cases) for run in runs):>6}")
    folders: dict[str, list[float]] = {}
    for run in runs:
        for case in run.cases:
            folder = "/".join(case.node.split("/")[:2]) if not run.tier.command else run.tier.name
            folders.setdefault(folder, []).append(case.seconds)
    lines += ["", "=== test time per folder (sum of its tests' own times)", f"{'folder':<24} {'tests':>6} {'s':>8}"]
    lines += [f"{folder:<24} {len(times):>6} {sum(times):>8.0f}"
              for folder, times in sorted(folders.items(), key=lambda item: -sum(item[1]))]
    slowest = sorted(((case, run.tier.name) for run in runs for case in run.cases), key=lambda c: -c[0].seconds)
    lines += ["", f"=== the {SLOWEST_SHOWN} slowest tests (setup + call + teardown)"]
    lines += [f"{case.seconds:>7.1f} s  {tier:<16} {case.node}" for case, tier in slowest[:SLOWEST_SHOWN]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=[tier.name for tier in TIERS],
                        help="run this tier (repeatable; default: all)")
    parser.add_argument("--workers", type=int, default=int(os.environ.get("TURNLOG_TEST_WORKERS", "3")),
                        help="pytest-xdist workers of the services tier (default 3, TURNLOG_TEST_WORKERS)")
    parser.add_argument("--reports", type=Path, default=ROOT / "build" / "test-reports",
                        help="folder of the JUnit XML reports (default build/test-reports)")
    options, pytest_args = parser.parse_known_args(argv)
    options.reports.mkdir(parents=True, exist_ok=True)
    chosen = {tier for tier in TIERS if not options.only or tier.name in options.only}
    if os.environ.get("TURNLOG_ADAPTER_FLOORS", "1") == "0":
        chosen -= {FLOOR_VENVS, ADAPTER_FLOORS}
    if ADAPTER_FLOORS not in chosen:
        chosen.discard(FLOOR_VENVS)
    started = time.monotonic()
    runs = [run for stage in STAGES
            for run in run_stage([tier for tier in stage if tier in chosen], options.reports.resolve(),
                                 options.workers, pytest_args)]
    runs.sort(key=lambda run: TIERS.index(run.tier))
    print(summary(runs, time.monotonic() - started), flush=True)
    return 0 if all(run.exit_code == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
