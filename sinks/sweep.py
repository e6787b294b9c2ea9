"""The finalization sweep: the safety net of finalization, over the store.

Sessions are finalized by the sink, in the transaction of the batch that leaves
them ended and complete (``sinks/finalization.py``; docs/design.md, "Guarantees":
finalize once). :func:`sweep_once` finalizes each session that is ended and
complete in the store but not finalized, each in its own transaction: there are
none in a store the sink writes; the sweep is for stores written otherwise (by a
sink of a release that finalized outside its batch's transaction, or restored
from such a backup). The guarded ``UPDATE`` makes it safe to run beside the sink,
in any number: a session finalized already matches 0 rows. The finalizer service
(``stream_processors/finalizer.py``) runs it on a timer.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from turnlog import metrics
from turnlog.faults import fault_point
from turnlog.sinks.base import SqlStore
from turnlog.sinks.finalization import report_finalized
from turnlog.tracing import NO_TRACING, Tracing, ended_on_failure

__all__ = ["finalize_now", "sweep_once", "SWEEP_PAGE"]

logger = logging.getLogger(__name__)
#: Sessions listed per query of the sweep.
SWEEP_PAGE = 100


def finalize_now(store: SqlStore, session_id: str, tracing: Tracing = NO_TRACING) -> bool:
    """Try the guarded finalize once, in its own transaction; True if this call finalized it.
    With ``tracing`` on, inside a ``finalize`` span of its own (a root, sampled at the ratio: the
    sweep has no ``session.ended`` record whose context it could link to).

    Raises:
        StoreUnavailableError: the database did not answer (retryable).
    """
    span = tracing.start("finalize", attributes={"turnlog.session_id": session_id, "turnlog.sweep": True})
    with ended_on_failure(span), store.writing() as writes:
        done = writes.finalize_session(session_id, dt.datetime.now(dt.UTC))
        ended_at = writes.session_ended_at(session_id) if done else None
    if span is not None:
        span.set({"turnlog.finalized": done})
        span.end()
    if done:
        fault_point("finalizer.after_update")
        report_finalized([session_id], {session_id: ended_at} if ended_at is not None else None)
    return done


def sweep_once(store: SqlStore, *, page: int = SWEEP_PAGE, tracing: Tracing = NO_TRACING) -> list[str]:
    """Finalize every session that is ended and complete in the store but not
    finalized; return the ids this call finalized. Then set the gauges
    ``turnlog_finalizer_sessions_unfinalized`` and ``turnlog_finalizer_unfinalized_oldest_seconds``
    to what is left (ended sessions still waiting for a gap, or ended since).

    Raises:
        StoreError: the database did not answer or refused (the next sweep tries again).
    """
    done: list[str] = []
    while True:
        with store.reading() as reads:
            ready = reads.finalizable_sessions(limit=page)
        finalized = [session_id for session_id in ready if finalize_now(store, session_id, tracing)]
        done.extend(finalized)
        # A short page is the last; a page of which nothing matched was finalized
        # meanwhile by someone else (the sink): stop rather than list it again.
        if len(ready) < page or not finalized:
            if done:
                logger.info("sweep finalized %d session(s) the sink had not", len(done))
            break
    with store.reading() as reads:
        count, oldest = reads.unfinalized_sessions()
    metrics.SESSIONS_UNFINALIZED.set(count)
    # This host's clock minus the agent's ended_at, at least 0 (clocks of different hosts may disagree).
    metrics.UNFINALIZED_OLDEST_SECONDS.set(0.0 if oldest is None else max(0.0, time.time() - oldest.timestamp()))
    return done
