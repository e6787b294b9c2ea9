"""Named fault points for crash tests and ``turnlog chaos``.

A fault point is a call ``fault_point("sink.after_write")`` placed where a crash
matters. It does nothing unless ``TURNLOG_FAULTS`` arms it, and the unarmed
check is one dict lookup on an empty dict::

    TURNLOG_FAULTS="sink.after_write=kill"            # SIGKILL this process at the first hit
    TURNLOG_FAULTS="sink.after_commit=kill@3"         # ... at the third hit
    TURNLOG_FAULTS="producer.after_produce=stall:500" # sleep 500 ms at every hit
    TURNLOG_FAULTS="sink.after_poll=stall:30000@1"    # sleep 30 s at the first hit only
    TURNLOG_FAULTS="sink.after_poll=stop@2"           # SIGSTOP this process at the second hit (a zombie,
                                                      # once its group has moved on; SIGCONT wakes it)

Points (see ``POINTS``): where each one sits is in its docstring line there.
``TURNLOG_FAULTS`` is read on first use (:func:`armed_faults`), never at import, so a
malformed value cannot make ``import turnlog...`` fail; it fails there with
:class:`~turnlog.exceptions.ConfigurationError`, naming the key. The CLI calls
:func:`armed_faults` at start-up, so a service with a bad value exits at once.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field

from turnlog.exceptions import ConfigurationError

__all__ = ["POINTS", "FaultAction", "armed_faults", "fault_point", "parse_faults", "ENV_VAR"]

logger = logging.getLogger(__name__)
ENV_VAR = "TURNLOG_FAULTS"

POINTS = {
    "producer.after_produce": "a record is handed to the producer, not yet acknowledged",
    "sequencer.after_emit": "a batch's emissions are acknowledged (with its state, in a transaction), its offsets "
    "not yet committed",
    "sequencer.before_commit": "a batch's records of a partition are produced in a transaction not yet committed",
    "sink.after_poll": "a batch is consumed, nothing of it written yet",
    "sink.after_write": "a batch's rows are written, the transaction not yet committed",
    "sink.after_finalize": (
        "a batch's sessions are finalized in its transaction (after the rows), nothing committed yet"
    ),
    "sink.after_commit": (
        "a batch's transaction (rows, aggregates and offsets) is committed, the next poll not yet made"
    ),
    "sink.after_forget": (
        "a batch's erasure ledger records are applied (rows deleted) in its transaction, nothing committed yet"
    ),
    "forget.after_request": "an erasure is recorded as pending in the store, its ledger record not yet written",
    "finalizer.after_update": (
        "the sweep's aggregate UPDATE of one session is committed, the next session's not yet made"
    ),
}


@dataclass(slots=True)
class FaultAction:
    """What an armed point does: ``kill`` (SIGKILL self), ``stop`` (SIGSTOP self) or ``stall``
    (sleep ``stall_ms``)."""

    kind: str
    on_hit: int = 1  # kill or stop at this hit (1 = first); a stall: only at this hit, 0: at every hit
    stall_ms: int = 0
    hits: int = field(default=0, compare=False)


def parse_faults(spec: str) -> dict[str, FaultAction]:
    """Parse ``name=kill[@N]`` / ``name=stop[@N]`` / ``name=stall:MS[@N]``, comma separated.

    Raises:
        ConfigurationError: an unknown point or action.
    """
    armed: dict[str, FaultAction] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        if name not in POINTS:
            raise ConfigurationError(f"{ENV_VAR}: unknown fault point {name!r} (known: {', '.join(sorted(POINTS))})")
        try:
            if action == "kill" or action.startswith("kill@"):
                armed[name] = FaultAction("kill", on_hit=int(action[5:] or 1))
            elif action == "stop" or action.startswith("stop@"):
                armed[name] = FaultAction("stop", on_hit=int(action[5:] or 1))
            elif action.startswith("stall:"):
                stall_ms, _, at = action[6:].partition("@")
                armed[name] = FaultAction("stall", stall_ms=int(stall_ms), on_hit=int(at or 0))
            else:
                raise ValueError(action)
        except ValueError as e:
            raise ConfigurationError(
                f"{ENV_VAR}: bad action {action!r} for {name} (kill[@N], stop[@N] or stall:MS[@N])"
            ) from e
    return armed


_armed: dict[str, FaultAction] | None = None  # parsed from the environment on first use
_armed_lock = threading.Lock()


def armed_faults() -> dict[str, FaultAction]:
    """The points ``TURNLOG_FAULTS`` arms, parsed once, on the first call.

    Raises:
        ConfigurationError: ``TURNLOG_FAULTS`` is malformed (each call raises, until it is fixed).
    """
    global _armed
    if _armed is None:
        with _armed_lock:
            if _armed is None:
                _armed = parse_faults(os.environ.get(ENV_VAR, ""))
    return _armed


def fault_point(name: str) -> None:
    """Crash or stall here if ``TURNLOG_FAULTS`` arms ``name``; otherwise do nothing.

    Raises:
        ConfigurationError: ``TURNLOG_FAULTS`` is malformed (see :func:`armed_faults`).
    """
    action = (_armed if _armed is not None else armed_faults()).get(name)
    if action is None:
        return
    action.hits += 1
    if action.kind == "stall":
        if action.on_hit in (0, action.hits):
            time.sleep(action.stall_ms / 1000)
    elif action.kind == "stop":
        if action.hits == action.on_hit:
            logger.warning("fault point %s: SIGSTOP (hit %d)", name, action.hits)
            os.kill(os.getpid(), signal.SIGSTOP)  # returns once SIGCONT wakes the process
    elif action.hits >= action.on_hit:
        logger.warning("fault point %s: SIGKILL (hit %d)", name, action.hits)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
