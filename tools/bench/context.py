"""What the phases of one ``turnlog bench`` run share (``runner.py`` runs them in order).

Each phase is a function ``(context, report) -> None`` that adds its figures to the report.
What a phase needs from an earlier one it reads from the report (``cpu_at_capacity`` for the
in-process costs, every figure for the ratios) or from the context: :class:`Workload` is what
every run has (a run of one phase alone too), :class:`BenchRun` adds the run's own database and
pipeline, with the sampler and the rates that the capacity and sustained phases set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnlog.deploy.processes import ServiceProcess
from turnlog.settings import TurnlogSettings
from turnlog.tools.bench.options import BenchOptions
from turnlog.tools.bench.probes import Sampler
from turnlog.tools.bench.workload import SessionPlan

__all__ = ["Report", "Workload", "BenchRun", "PIPELINE_READY_TIMEOUT_SECONDS"]

#: The report a run returns and writes: each phase adds its figures under keys of its own.
Report = dict[str, Any]

#: Longest the pipeline's services may take to write their ready files (seconds).
PIPELINE_READY_TIMEOUT_SECONDS = 180.0


@dataclass
class Workload:
    """What every run has: the run's settings (its own topics, groups and spool folder), the
    options, its id and log folder, and the workload: ``plans`` and ``payloads``, their events
    encoded (``(session key, event bytes)``, the sessions interleaved)."""

    settings: TurnlogSettings
    options: BenchOptions
    run_id: str
    log_dir: Path
    plans: list[SessionPlan]
    payloads: list[tuple[str, bytes]]


@dataclass
class BenchRun(Workload):
    """A full run: its database (``dsn``, psycopg; ``admin_dsn`` for ``CREATE DATABASE`` and the
    cluster's counters) and its pipeline's processes, stopped when the run ends.

    The capacity phase starts the pipeline and the sampler and measures the capacity C; the
    sustained phase measures the sustained maximum M, which sets the load of the latency, resume
    and direct peer phases. A phase that reads one of them before it is set fails, naming the
    phase that sets it.
    """

    database: str
    dsn: str
    admin_dsn: str
    processes: dict[str, ServiceProcess]
    #: The pipeline's lag and progress, sampled from the capacity phase to the timeline phase.
    sampler: Sampler | None = None
    #: C: durable events/s draining a backlog (the capacity phase).
    capacity: float | None = None
    #: M: the highest offered rate the pipeline kept up with (the sustained phase).
    sustained: float | None = None

    def running_sampler(self) -> Sampler:
        """The sampler the capacity phase started.

        Raises:
            RuntimeError: the capacity phase has not run.
        """
        if self.sampler is None:
            raise RuntimeError("no sampler: the capacity phase starts it")
        return self.sampler

    def capacity_rate(self) -> float:
        """C, events/s.

        Raises:
            RuntimeError: the capacity phase has not run.
        """
        if self.capacity is None:
            raise RuntimeError("no capacity: the capacity phase measures it")
        return self.capacity

    def sustained_rate(self) -> float:
        """M, events/s.

        Raises:
            RuntimeError: the sustained phase has not run.
        """
        if self.sustained is None:
            raise RuntimeError("no sustained rate: the sustained phase measures it")
        return self.sustained
