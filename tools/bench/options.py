"""What ``turnlog bench`` is asked to do: :class:`BenchOptions`, and :func:`quick_options` for a smoke test."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import SecretStr

from turnlog.tools.bench.transactions import MODERATE_RATE

__all__ = ["BenchOptions", "quick_options"]


@dataclass(frozen=True)
class BenchOptions:
    sessions_dir: Path
    admin_url: SecretStr  # holds the password: unwrapped only where a connection is made
    sessions: int = 1000
    turns_per_session: int = 40
    phase_seconds: float = 30.0
    flush_interval: float = 0.5
    #: Time compression of the replay; the offered rate is set by how many sessions run.
    speed: float = 10.0
    memory_sessions: int = 5000
    report_path: Path | None = None
    plot_path: Path | None = None
    profile_dir: Path | None = None
    keep: bool = False
    log_dir: Path = Path(".turnlog-bench")
    metrics_port: int = 9464
    #: Resumes per path (store, API) in the resume phase, taken one after another.
    resume_samples: int = 40
    #: Resumes per path with no load first: the same run's idle baseline.
    resume_idle_samples: int = 10
    #: Longest the resume phase's load runs (seconds); resumes start 3 s in, none starts in its
    #: last 5 s, and the load stops once every path has its samples.
    resume_seconds: float = 150.0
    #: Also resume through a ``turnlog api`` started for the phase.
    resume_api: bool = True
    #: Run the direct peer (``direct.py``).
    direct: bool = True
    #: Connections the direct agents share (PgBouncer in transaction mode, as a user would run it).
    direct_connections: int = 16
    #: Pairs of variants (transactions off and on) in the transactions phase; 0 skips it.
    transactions_repetitions: int = 1
    #: Events/s the transactions phase offers under moderate load.
    transactions_rate: float = MODERATE_RATE
    #: Pairs of variants (encryption off and on) in the encryption phase's moderate load; 0 skips it.
    encryption_repetitions: int = 1
    #: Events/s the encryption phase offers (the issue's bound: on within 10 % of off there).
    encryption_rate: float = MODERATE_RATE
    #: Pairs of variants (tracing off and on) in the tracing phase (``only="tracing"``).
    tracing_repetitions: int = 1
    #: Run one phase alone (no baselines, no run-wide pipeline): ``"transactions"``, ``"encryption"`` or
    #: ``"tracing"`` (run only so).
    only: Literal["transactions", "encryption", "tracing"] | None = None


def quick_options(options: BenchOptions) -> BenchOptions:
    """``options`` cut down for a smoke test of every phase (a minute or two, figures
    not comparable with a full run): short phases, 10 turns per session, few resumes,
    small memory steps."""
    from dataclasses import replace

    return replace(
        options,
        turns_per_session=min(options.turns_per_session, 10),
        phase_seconds=min(options.phase_seconds, 8.0),
        memory_sessions=min(options.memory_sessions, 500),
        resume_samples=min(options.resume_samples, 4),
        resume_idle_samples=min(options.resume_idle_samples, 2),
        resume_seconds=min(options.resume_seconds, 30.0),
    )
