"""The finalizer (Faust): computes each session's aggregates exactly once.

On ``session.ended`` in ``<prefix>.transcript`` it runs the store's guarded
``UPDATE`` (``SqlStore.finalize_session``), retrying for a short while until
the sink has stored the session up to ``end_seq``. A timer sweep finalizes
every ended, complete session it finds, so a session whose rows arrive later
(sink down, restart) is still finalized. A second finalizer, or a re-delivered
``session.ended``, matches 0 rows: finalize once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time

import faust

from turnlog.faults import fault_point
from turnlog.schemas import EventValidationError, SessionEnded, decode_event
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore, StoreError, open_store
from turnlog.sinks.errors import store_errors
from turnlog import metrics
from turnlog.stream_processors.app import make_app, raw_topic

__all__ = ["build_finalizer", "finalize_now"]

logger = logging.getLogger(__name__)
WAIT_FOR_SINK_SECONDS = 10.0
#: The ``type`` of a session.ended as it appears in the record's JSON.
SESSION_ENDED_MARKER = b'"session.ended"'
FINALIZER_BATCH = 500
FINALIZER_BATCH_WAIT_SECONDS = 0.05


def finalize_now(store: SqlStore, session_id: str) -> bool:
    """Try the guarded finalize once, in its own transaction; True if this call finalized it.

    Raises:
        StoreUnavailableError: the database did not answer (retryable).
    """
    with store_errors(), store.engine.begin() as conn:
        done = store.finalize_session(conn, session_id, dt.datetime.now(dt.timezone.utc))
    if done:
        fault_point("finalizer.after_update")
        metrics.SESSIONS_FINALIZED.inc()
        logger.info("finalized %s", session_id)
    return done


def _is_finalized(store: SqlStore, session_id: str) -> bool:
    with store_errors(), store.engine.connect() as conn:
        position = store.session_position(conn, session_id)
    return position is not None and position.status == "finalized"


async def _finalize_when_stored(store: SqlStore, session_id: str) -> None:
    """Finalize ``session_id`` once the sink has stored it up to ``end_seq``,
    waiting at most ``WAIT_FOR_SINK_SECONDS``; after that the sweep takes over."""
    deadline = time.monotonic() + WAIT_FOR_SINK_SECONDS
    delay = 0.05
    while time.monotonic() < deadline:
        try:
            if await asyncio.to_thread(finalize_now, store, session_id):
                return
            if await asyncio.to_thread(_is_finalized, store, session_id):
                logger.info("%s was finalized already", session_id)  # a re-delivered session.ended, or another finalizer won
                return
        except StoreError as e:  # unavailable or refused: the sweep tries again
            logger.warning("finalizing %s: %s", session_id, e)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
    logger.info("%s is not complete in the store yet; the sweep will finalize it", session_id)


def build_finalizer(settings: TurnlogSettings, store: SqlStore | None = None) -> faust.App:
    """The finalizer app (consumer group ``settings.finalizer_group``)."""
    app = make_app(settings, settings.finalizer_group)
    transcript = raw_topic(app, settings.topics.transcript)
    holder: dict[str, SqlStore] = {}

    def get_store() -> SqlStore:
        if "store" not in holder:
            holder["store"] = store or open_store(settings.database_url)
        return holder["store"]

    @app.agent(transcript, name="finalize-ended")
    async def finalize_ended(stream: faust.StreamT[bytes]) -> None:
        async for batch in stream.take(FINALIZER_BATCH, within=FINALIZER_BATCH_WAIT_SECONDS):
            for raw in batch:
                # Only session.ended matters, one record in hundreds: skip the
                # others without decoding them (a turn whose text holds the
                # marker is decoded and then skipped by type).
                if SESSION_ENDED_MARKER not in raw:
                    continue
                try:
                    event = decode_event(raw)
                except EventValidationError as e:
                    logger.error("skipping an undecodable transcript record: %s", e.reason)
                    continue
                if isinstance(event, SessionEnded):
                    await _finalize_when_stored(get_store(), event.session_id)

    @app.timer(interval=settings.finalizer_sweep_seconds)
    async def sweep() -> None:
        store_ = get_store()

        def ready() -> list[str]:
            with store_errors(), store_.engine.connect() as conn:
                return store_.finalizable_sessions(conn)

        try:
            for session_id in await asyncio.to_thread(ready):
                await asyncio.to_thread(finalize_now, store_, session_id)
        except StoreError as e:
            logger.warning("sweep skipped: %s", e)

    return app
