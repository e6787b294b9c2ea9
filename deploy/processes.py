"""Run turnlog's services as child processes (for the demo, tests and local runs).

Each service is a real OS process (``python -m turnlog.cli <service>``) with
its settings in the environment and its output in a log file, so it can be
SIGKILLed like any production worker.

Readiness is read from a file, never from log text: each service gets its own
``TURNLOG_READY_FILE`` (``<log dir>/<name>.ready``, beside its log), which the
service writes when it is ready and removes when it is not
(:mod:`turnlog.readiness` says when, for each service).
:meth:`ServiceProcess.ready` and :meth:`ServiceProcess.wait_ready` read it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from turnlog.exceptions import ConfigurationError
from turnlog.readiness import NotReadyError, ReadyMark, mark_not_ready, read_ready
from turnlog.settings import TurnlogSettings

__all__ = ["ServiceProcess", "start_pipeline", "stop_all", "turnlog_command", "wait_all_ready"]

#: Seconds between two looks at a ready file.
READY_POLL_SECONDS = 0.1

logger = logging.getLogger(__name__)


def turnlog_command(*args: str) -> list[str]:
    """The argv that runs ``turnlog ARGS`` with this interpreter."""
    return [sys.executable, "-m", "turnlog.cli", *args]


class ServiceProcess:
    """One child process with its log file, and its ready file if it is a service.

    ``ready_path`` (a service: ``sequencer``, ``sink``, ...): passed to the child as
    ``TURNLOG_READY_FILE``; a file left there by an earlier process is removed
    first. None: the child gets no ``TURNLOG_READY_FILE`` (not even the
    parent's), and :meth:`ready` cannot be asked.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        stdout_pipe: bool = False,
        ready_path: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.ready_path = ready_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        child_env = {**os.environ, **env}
        child_env.pop("TURNLOG_READY_FILE", None)
        if ready_path is not None:
            ready_path.parent.mkdir(parents=True, exist_ok=True)
            mark_not_ready(ready_path)
            child_env["TURNLOG_READY_FILE"] = str(ready_path)
        self._log: IO[bytes] = log_path.open("ab")
        self.popen = subprocess.Popen(
            list(argv),
            env=child_env,
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

    def ready(self) -> bool:
        """Whether the process is alive and its ready file is there, written by this process (its pid).

        Raises:
            ConfigurationError: it was started without a ready file.
            ValueError: the file at ``ready_path`` is not a ready file.
        """
        return self._own_mark() is not None

    def _own_mark(self) -> ReadyMark | None:
        if self.ready_path is None:
            raise ConfigurationError(f"{self.name} was started without a ready file")
        mark = read_ready(self.ready_path)
        return mark if mark is not None and mark.pid == self.pid and self.alive() else None

    def wait_ready(self, timeout: float = 120.0) -> ReadyMark:
        """Poll the ready file (every :data:`READY_POLL_SECONDS`) until :meth:`ready`; at most ``timeout`` seconds.

        Returns:
            The mark the service wrote.

        Raises:
            NotReadyError: the process exited first, or ``timeout`` passed; the message names its log.
            ConfigurationError: it was started without a ready file.
        """
        deadline = time.monotonic() + timeout
        while True:
            if (mark := self._own_mark()) is not None:
                return mark
            if not self.alive():
                raise NotReadyError(f"{self.name} exited (code {self.popen.returncode}) before it was ready;"
                                    f" see {self.log_path}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise NotReadyError(f"{self.name} not ready within {timeout:.0f} s; see {self.log_path}")
            time.sleep(min(READY_POLL_SECONDS, left))

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is flushed."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait()

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; returns the exit code."""
        self.terminate()
        return self.wait_stopped(timeout)

    def terminate(self) -> None:
        """SIGTERM, without waiting: the service drains and exits on its own (:meth:`wait_stopped`)."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the process to exit, then SIGKILL it; returns the exit code."""
        if self.alive():
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
    return {
        name: ServiceProcess(
            name, turnlog_command(name), env, log_dir / f"{name}.log", ready_path=log_dir / f"{name}.ready"
        )
        for name in services
    }


def wait_all_ready(
    processes: Mapping[str, ServiceProcess] | Sequence[ServiceProcess], timeout: float = 120.0
) -> dict[str, ReadyMark]:
    """Wait until every process is ready (:meth:`ServiceProcess.wait_ready`), within one deadline of ``timeout`` s.

    Returns:
        ``{name: its mark}``.

    Raises:
        NotReadyError: the first process found not ready in time, or exited.
    """
    items = processes.values() if isinstance(processes, Mapping) else processes
    deadline = time.monotonic() + timeout
    return {process.name: process.wait_ready(max(0.0, deadline - time.monotonic())) for process in items}


def stop_all(processes: Mapping[str, ServiceProcess] | Sequence[ServiceProcess], timeout: float = 20.0) -> None:
    """Stop every process: SIGTERM to all at once, so they drain side by side, then SIGKILL to any
    still running ``timeout`` seconds later."""
    items = list(processes.values() if isinstance(processes, Mapping) else processes)
    for process in items:
        process.terminate()
    deadline = time.monotonic() + timeout
    for process in items:
        process.wait_stopped(max(0.0, deadline - time.monotonic()))
