"""The finalizer (``turnlog finalizer``): the safety-net sweep of finalization.

Sessions are finalized by the sink, in the transaction of the batch that
leaves them ended and complete (``SqlStore.write_transcript``; docs/design.md,
"Guarantees": finalize once): the guarded ``UPDATE`` runs after the batch's rows and
commits with the batch's offsets, so a crash before the commit re-applies the
rows and the finalization together, and a re-delivered batch finalizes
nothing twice. The aggregates are computed in SQL from the persisted rows and
event timestamps, never from running totals or ``now()``, so it does not
matter which process runs the ``UPDATE``.

This service consumes no topic. Every ``finalizer_sweep_seconds`` it runs the
store's sweep (``sinks/sweep.py``): it finalizes each session that is ended and
complete in the store but not finalized, each in its own transaction. There are
none in a store the sink writes; the sweep is for stores written otherwise: by a
sink of a release that finalized outside its batch's transaction, or restored
from such a backup. The same guard makes it safe to run beside the sink, in any
number: a session finalized already matches 0 rows.

It stays a Faust app of one timer and no agent (consumer group
``finalizer_group``): such an app starts, joins its group (subscribed to its
assignor topic only), runs its timer and stops cleanly, and the CLI, the
deploy scripts and ``turnlog chaos`` run and watch it like the sequencer.
"""

from __future__ import annotations

import asyncio
import logging

import faust

from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore, StoreError, open_store
from turnlog.sinks.sweep import sweep_once
from turnlog.stream_processors.app import make_app
from turnlog.tracing import service_tracing

__all__ = ["build_finalizer"]

logger = logging.getLogger(__name__)


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
