"""Readiness as a file: a service says it is ready by writing one, not by a log line.

A service started with ``TURNLOG_READY_FILE`` (:attr:`TurnlogSettings.ready_file
<turnlog.settings.TurnlogSettings.ready_file>`) writes that file at its real
readiness point and removes it when it stops being ready or shuts down:

- the Faust workers (sequencer, finalizer): ready when a rebalance has fully
  completed, recovery and seek included; not ready from the start of the next
  rebalance (``turnlog.stream_processors.worker``);
- the sink and the analytics projection: ready once the consumer has an
  assignment and has seeked it to the stored offsets; not ready while it is
  revoked (``turnlog.sinks.service``);
- the API: ready once its transcript hub follows the transcript topic, or at
  start-up without a hub (``turnlog.api``).

The file is one JSON object, written atomically (a temporary file in the same
folder, then ``os.replace``), so a reader sees no file or a whole one::

    {"component": "sink", "pid": 4242, "ready_at": 1796117385.25}

``ready_at`` is the wall-clock time of the mark, in seconds since the Unix epoch.
The process runner (``turnlog.deploy.processes``) gives each service its own
path and reads it with :func:`read_ready`; it also checks ``pid``, so a file
left behind by a SIGKILLed process (nothing removes it) is not taken for the
new one's. Unset (the default), every function here does nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from turnlog.exceptions import TurnlogError

__all__ = ["NotReadyError", "ReadyMark", "mark_not_ready", "mark_ready", "read_ready"]


class NotReadyError(TurnlogError):
    """A service did not become ready within its deadline (or exited first)."""


@dataclass(frozen=True, slots=True)
class ReadyMark:
    """The content of a ready file."""

    component: str
    """The service that wrote it: ``sequencer``, ``finalizer``, ``sink``, ``analytics``, ``api``."""
    pid: int
    """The id of the process that wrote it."""
    ready_at: float
    """When it became ready: wall-clock seconds since the Unix epoch."""


def mark_ready(path: Path | None, component: str) -> ReadyMark | None:
    """Write the ready file at ``path`` for this process (``component``, its pid, now).

    Atomic: the body goes to a temporary file in ``path``'s folder, which then
    replaces ``path``; an earlier mark is overwritten. ``path`` None (the setting
    unset): nothing is written and None is returned.

    Returns:
        The mark written, or None.

    Raises:
        OSError: the file could not be written (the folder is missing or not
            writable); no temporary file is left behind.
    """
    if path is None:
        return None
    mark = ReadyMark(component=component, pid=os.getpid(), ready_at=time.time())
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            json.dump(asdict(mark), out)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return mark


def mark_not_ready(path: Path | None) -> bool:
    """Remove the ready file at ``path``, if there is one.

    Returns:
        True if a file was removed; False if there was none or ``path`` is None.

    Raises:
        OSError: the file exists and could not be removed.
    """
    if path is None:
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def read_ready(path: Path) -> ReadyMark | None:
    """The mark in the ready file at ``path``, or None if there is no file.

    Raises:
        ValueError: the file is not a ready file (not JSON, or fields missing or
            of the wrong type). It is written atomically, so a file being
            written is never seen half-way.
        OSError: the file exists and could not be read.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        body = json.loads(text)
        mark = ReadyMark(component=body["component"], pid=body["pid"], ready_at=body["ready_at"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a ready file: {e}") from e
    if not (isinstance(mark.component, str) and type(mark.pid) is int
            and isinstance(mark.ready_at, (int, float)) and not isinstance(mark.ready_at, bool)):
        raise ValueError(f"{path} is not a ready file: {body!r}")
    return mark
