"""One retention sweep on demand (``turnlog retention-sweep``, for cron).

docs/design.md, "Encryption and erasure". The transcript sink sweeps on its own
every few seconds (``turnlog.sinks.erasure_ledger.ErasureDuties``); this runs the
same sweep once, from outside the sink: every finalized or abandoned session whose
``ended_at`` is older than its fleet's policy (``TURNLOG_RETENTION_DAYS``,
``TURNLOG_RETENTION_DAYS_BY_FLEET``) and has no erasure yet gets a pending erasure
(``requested_by`` and ``reason`` ``retention``), in bounded batches; the ledger
records the store holds as unpublished are produced to ``<prefix>.erasures``; then
it waits up to ``wait_seconds`` for the sink to apply the sweep's erasures. Running
it twice, or beside the sink's own sweep, requests each erasure once.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass

from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import SqlStore
from turnlog.sinks.erasure_ledger import ErasureDuties
from turnlog.sinks.exceptions import StoreUnavailableError

__all__ = ["RetentionSweep", "run_retention_sweep"]

#: How often the wait looks whether the sink has applied the sweep's erasures (seconds).
_POLL_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class RetentionSweep:
    """What one sweep did (counts only, never content). ``requested``: sessions past the policy
    given an erasure by this sweep; ``published``: ledger records the broker acknowledged (this
    sweep's and any left pending before it); ``done``: this sweep's erasures the store holds as
    applied when the wait ended."""

    requested: int
    published: int
    done: int

    @property
    def pending(self) -> int:
        """This sweep's erasures not applied yet (the sink applies them once their record is published)."""
        return self.requested - self.done


def run_retention_sweep(
    settings: TurnlogSettings, store: SqlStore, *, wait_seconds: float = 0.0, now: dt.datetime | None = None
) -> RetentionSweep:
    """Sweep, publish, and wait (module docstring). ``now`` (UTC) is the time the policy counts
    back from (default: the current time).

    Raises:
        StoreUnavailableError: the store did not answer while the sweep requested its erasures
            (those requested before stay pending; the next sweep or the sink goes on).
    """
    duties = ErasureDuties(settings, store)
    try:
        swept: list[str] = []
        while batch := duties.sweep_retention(now):  # each batch is bounded, and excluded from the next
            swept += batch
        published = 0
        while acked := duties.publish_pending():  # bounded batches; stops when the broker acknowledges none
            published += acked
    finally:
        duties.close()
    done = _count_done(store, swept)
    deadline = time.monotonic() + wait_seconds
    while done < len(swept) and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
        done = _count_done(store, swept)
    return RetentionSweep(requested=len(swept), published=published, done=done)


def _count_done(store: SqlStore, session_ids: Sequence[str]) -> int:
    """How many of ``session_ids`` the store holds as erased; 0 for those it cannot be asked about now."""
    try:
        with store.reading() as reads:
            return reads.completed_erasures(session_ids)
    except StoreUnavailableError:
        return 0
