"""The finalizer (``turnlog finalizer``): the safety-net sweep of finalization.

Sessions are finalized by the sink, in the transaction of the batch that
leaves them ended and complete (``SqlStore.write_transcript``; docs/design.md,
"Guarantees": finalize once): the guarded ``UPDATE`` runs after the batch's rows and
commits with the batch's offsets, so a crash before the commit re-applies the
rows and the finalization together, and a re-delivered batch finalizes
nothing twice. The aggregates are computed in SQL from the persisted rows and
event timestamps, never from running totals or ``now()``, so it does not
matter which process runs the ``UPDATE``.

This service consumes no topic. It sweeps: every ``finalizer_sweep_seconds``
it finalizes each session that is ended and complete in the store but not
finalized, each in its own transaction. There are none in a store the sink
writes; the sweep is for stores written otherwise: by a sink of a release that
finalized outside its batch's transaction, or restored from such a backup. The same guard makes it safe to
run beside the sink, in any number: a session finalized already matches 0 rows.

It stays a Faust app of one timer and no agent (consumer group
``finalizer_group``): such an app starts, joins its group (subscribed to its
assignor topic only), runs its timer and stops cleanly, and the CLI, the
deploy scripts and ``turnlog chaos`` run and watch it like the sequencer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time

import faust

from turnlog import metrics
from turnlog.faults import fault_point
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore, StoreError, open_store
from turnlog.sinks.base import report_finalized
from turnlog.stream_processors.app import make_app
from turnlog.tracing import NO_TRACING, Tracing, ended_on_failure, service_tracing

__all__ = ["build_finalizer", "finalize_now", "sweep_once"]

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


def build_finalizer(settings: TurnlogSettings, store: SqlStore | None = None) -> faust.App:
    """The finalizer app (consumer group ``settings.finalizer_group``): the sweep timer only.

    Raises:
        ConfigurationError: ``settings.tracing`` is on without ``turnlog[otel]`` installed.
    """
    tracing = service_tracing(settings, "finalizer")
    app = make_app(settings, settings.finalizer_group)
    holder: dict[str, SqlStore] = {}

    def get_store() -> SqlStore:
        if "store" not in holder:
            holder["store"] = store or open_store(settings.database_url)
        return holder["store"]

    @app.timer(interval=settings.finalizer_sweep_seconds)
    async def sweep() -> None:
        try:
            await asyncio.to_thread(sweep_once, get_store(), tracing=tracing)
        except StoreError as e:
            logger.warning("sweep skipped: %s", e)

    return app
