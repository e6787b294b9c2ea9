"""Run turnlog's services as child processes (for the demo, tests and local runs).

Each service is a real OS process (``python -m turnlog.cli <service>``) with
its settings in the environment and its output in a log file, so it can be
SIGKILLed like any production worker.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from turnlog.settings import TurnlogSettings

__all__ = ["ServiceProcess", "start_pipeline", "stop_all", "turnlog_command"]

logger = logging.getLogger(__name__)


def turnlog_command(*args: str) -> list[str]:
    """The argv that runs ``turnlog ARGS`` with this interpreter."""
    return [sys.executable, "-m", "turnlog.cli", *args]


class ServiceProcess:
    """One child process with its log file."""

    def __init__(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path, *, stdout_pipe: bool = False
    ) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = log_path.open("ab")
        self.popen = subprocess.Popen(
            list(argv),
            env={**os.environ, **env},
            stdout=subprocess.PIPE if stdout_pipe else self._log,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
        )
        logger.info("started %s (pid %d), log %s", name, self.popen.pid, log_path)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is flushed."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait()

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; returns the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in %.0f s; sending SIGKILL", self.name, timeout)
                self.kill()
        self._log.close()
        return self.popen.returncode


def start_pipeline(
    settings: TurnlogSettings,
    log_dir: Path,
    *,
    services: Sequence[str] = ("sequencer", "sink", "finalizer"),
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, ServiceProcess]:
    """Start one worker of each service, configured by ``settings`` (plus ``extra_env``, e.g. ``TURNLOG_FAULTS``)."""
    env = {**settings.as_environment(), **(extra_env or {})}
    return {name: ServiceProcess(name, turnlog_command(name), env, log_dir / f"{name}.log") for name in services}


def stop_all(processes: Mapping[str, ServiceProcess] | Sequence[ServiceProcess], timeout: float = 20.0) -> None:
    """Stop every process (SIGTERM, then SIGKILL after ``timeout`` seconds)."""
    items = processes.values() if isinstance(processes, Mapping) else processes
    for process in items:
        process.stop(timeout)
