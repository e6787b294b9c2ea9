"""A test script run as a child process that reports its progress as JSON lines on stdout.

The crash tests start an agent script (``tests/adapters/*_script.py``,
``tests/crash/scripted_agent.py``, ...), wait until it says it has reached a
known point, and SIGKILL it there; :class:`ScriptProcess` is that child and its lines.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from turnlog.deploy.processes import ServiceProcess

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
LOG_TAIL_CHARS = 4000


class ScriptProcess:
    """``python -m <module> <args>`` with ``env`` (on top of this process's environment);
    each line it prints is one JSON object, collected in order by a reader thread."""

    def __init__(self, module: str, *args: str, env: Mapping[str, str], log_path: Path, name: str) -> None:
        argv = [sys.executable, "-m", module, *args]
        # The child imports ``tests.…`` modules whatever folder pytest was started in.
        python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.process = ServiceProcess(name, argv, {**env, "PYTHONPATH": python_path}, log_path, stdout_pipe=True)
        self._lines: list[dict[str, Any]] = []
        self._stdout_closed = False
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.popen.stdout is not None
        try:
            for raw in self.process.popen.stdout:
                line = json.loads(raw)
                with self._changed:
                    self._lines.append(line)
                    self._changed.notify_all()
        finally:
            # End of output (the child exited, or printed a line that is not JSON): a wait
            # for a line that has not come fails now instead of at its timeout.
            with self._changed:
                self._stdout_closed = True
                self._changed.notify_all()

    def lines_so_far(self) -> list[dict[str, Any]]:
        with self._changed:
            return list(self._lines)

    def wait_for(self, probe: Callable[[list[dict[str, Any]]], T], what: str, timeout: float) -> T:
        """Until ``probe(lines so far)`` is truthy, and that value. Fails, with the tail of the
        child's log, after ``timeout`` seconds or once the child's output ended without it."""
        with self._changed:
            self._changed.wait_for(lambda: probe(self._lines) or self._stdout_closed, timeout=timeout)
            found = probe(self._lines)
            assert found, f"{self.process.name}: gave up waiting for {what}\n{self.log_tail()}"
            return found

    def first_with(self, key: str, timeout: float) -> dict[str, Any]:
        """The first line holding ``key``, waited for as :meth:`wait_for` does."""
        return self.wait_for(lambda lines: next((line for line in lines if key in line), None), f"a line with {key!r}", timeout)

    def log_tail(self) -> str:
        return self.process.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
