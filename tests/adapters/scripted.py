"""An agent script in a child process that reports progress as JSON lines on stdout."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from turnlog.deploy.processes import ServiceProcess


class ScriptedAgent:
    """``python -m <module> <phase> <session id>`` with ``env``; its stdout lines are parsed as JSON."""

    def __init__(self, module: str, phase: str, session_id: str, env: dict[str, str], log_dir: Path) -> None:
        argv = [sys.executable, "-m", module, phase, session_id]
        self.log_path = log_dir / f"agent-{phase}.log"
        self.process = ServiceProcess(f"agent-{phase}", argv, env, self.log_path, stdout_pipe=True)
        self.lines: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.popen.stdout is not None
        for raw in self.process.popen.stdout:
            with self._changed:
                self.lines.append(json.loads(raw))
                self._changed.notify_all()

    def wait_for(self, key: str, timeout: float) -> None:
        """Until a line holds ``key``; fails with the agent's log after ``timeout`` seconds."""
        with self._changed:
            assert self._changed.wait_for(lambda: any(key in line for line in self.lines), timeout=timeout), self.log_path.read_text()

    def kill(self) -> None:
        self.process.kill()
