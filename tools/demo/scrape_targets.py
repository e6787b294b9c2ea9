"""A Prometheus file_sd targets file for the processes a demo or chaos run starts.

With a folder (``--prometheus-targets DIR``; ``deploy/prometheus.sh`` reads
``$TURNLOG_STATE_DIR/prometheus/targets/``), every service worker and agent the run starts gets
a metrics port of its own (``TURNLOG_METRICS_PORT``), and ``DIR/<name>.json`` lists them all,
one job per kind (``turnlog-sequencer``, ``turnlog-sink``, ``turnlog-finalizer``,
``turnlog-agent``, ...), in Prometheus' file_sd format::

    [{"targets": ["127.0.0.1:19100"], "labels": {"job": "turnlog-sink", "worker": "sink"}}, ...]

A worker replaced after a kill, or an agent resumed in a new process, keeps its port, so
Prometheus sees the same target go down and come back; an agent that finished its session is
taken off the list (:meth:`ScrapeTargets.remove`), so an ended agent is not a target down.
Agents are listed by port alone (no session id: label values stay a bounded set). The file is
rewritten atomically at each change and removed by :meth:`ScrapeTargets.close`. Without a
folder nothing is written and no process gets a metrics port.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

__all__ = ["FIRST_PORT", "ScrapeTargets"]

#: Lowest port handed out; below Linux's ephemeral range (32768-60999), so no client connection takes
#: a port between its choice here and the child's bind.
FIRST_PORT = 19100
#: Highest port handed out.
LAST_PORT = 32767
HOST = "127.0.0.1"


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


class ScrapeTargets:
    """The metrics ports of a run's processes and the targets file that lists them.

    ``folder`` None: off (:meth:`environment` gives nothing). ``name``: the file's stem
    (``turnlog-chaos`` writes ``turnlog-chaos.json``).
    """

    def __init__(self, folder: Path | None, name: str, *, first_port: int = FIRST_PORT) -> None:
        self.path = None if folder is None else folder / f"{name}.json"
        self._next_port = first_port
        self._targets: dict[str, tuple[str, int]] = {}  # worker -> (kind, port)
        self._removed: set[str] = set()  # workers taken off the list (their ports stay theirs)
        self._lock = threading.Lock()
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    def environment(self, kind: str, worker: str) -> dict[str, str]:
        """``{"TURNLOG_METRICS_PORT": port}`` for a process of ``kind`` (sink, agent, ...) that is ``worker``.

        The first call for a ``worker`` picks a free port (from :data:`FIRST_PORT` up) and lists it in
        the file; later calls (its replacement) give the same port. Empty when off.

        Raises:
            OSError: no free port left below the ephemeral range, or the file could not be written.
        """
        if self.path is None:
            return {}
        with self._lock:
            if worker not in self._targets:
                self._targets[worker] = (kind, self._free_port())
                self._write()
            return {"TURNLOG_METRICS_PORT": str(self._targets[worker][1])}

    def remove(self, worker: str) -> None:
        """Take ``worker`` off the list (its process ended for good); nothing if it is not listed."""
        if self.path is None:
            return
        with self._lock:
            if worker in self._targets and worker not in self._removed:
                self._removed.add(worker)
                self._write()

    def close(self) -> None:
        """Remove the file: the run's processes are gone."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def _free_port(self) -> int:
        taken = {port for _, port in self._targets.values()}
        for port in range(self._next_port, LAST_PORT + 1):
            if port not in taken and _free(port):
                self._next_port = port + 1
                return port
        raise OSError(f"no free port in {self._next_port}..{LAST_PORT} for a metrics endpoint")

    def _write(self) -> None:
        assert self.path is not None
        groups = [
            {"targets": [f"{HOST}:{port}"], "labels": {"job": f"turnlog-{kind}"} | ({} if kind == "agent" else
                                                                                    {"worker": worker})}
            for worker, (kind, port) in self._targets.items() if worker not in self._removed
        ]
        # Not *.json until complete: Prometheus watches the folder and must never read half a file.
        partial = self.path.with_name(f".{self.path.name}.partial")
        partial.write_text(json.dumps(groups, indent=1) + "\n")
        os.replace(partial, self.path)
