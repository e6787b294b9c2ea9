"""The HTTP API (FastAPI, served by uvicorn: ``turnlog api``).

Routes (all under ``/api`` need ``Authorization: Bearer <token>``, see ``auth.py``):

- ``GET /api/sessions``: ``{"sessions": [...], "next_cursor": id | null}``;
  filters ``status``, ``fleet``, ``started_after``, ``started_before`` (ISO 8601,
  UTC if no offset), paging by ``limit`` (1..100, default 20) and ``cursor``.
  Rows leave out ``metadata`` unless ``include=metadata`` (then a page also
  stops at ``api_page_bytes`` of metadata).
- ``GET /api/sessions/{id}``: the session row: status, durable position
  (``last_seq``: every seq up to it is stored), aggregates once finalized, metadata.
- ``GET /api/sessions/{id}/transcript?after_turn=&limit=``: one page of turns,
  ``{"session": ..., "turns": [...], "next_after_turn": n | null}``, in turn
  order from ``turn_index > after_turn`` (default -1), at most ``limit``
  (1..1000, default 100) turns and ``api_page_bytes`` of text and tool calls;
  ``next_after_turn`` (the last index given) is the next page's ``after_turn``,
  null on the last page. Each turn has ``status`` (``partial``, ``complete``,
  ``interrupted``) and ``barged_in`` (a complete turn the other speaker cut
  short). ``session`` leaves out ``metadata`` unless ``include=metadata``.
- ``GET /api/sessions/{id}/events``: Server-Sent Events, one per applied event:
  ``id`` = seq, ``event`` = type, ``data`` = the event's JSON as it crossed
  Kafka. Resumes after ``Last-Event-ID`` (which wins) or ``?after=<seq>``;
  backlog from the store, then the live tail (``turnlog.follow``). Ends after
  ``session.ended``, or with a ``stream.cutoff`` event (``data``:
  ``{"reason": "slow_client", "last_event_id": "<seq>"}``, no ``id``) when the
  client reads slower than the session writes; reconnecting with
  ``Last-Event-ID`` resumes exactly.
  Ends with a ``session.erased`` event (``data``: ``{"session_id": ...}``, no
  ``id``) when the session is forgotten while followed, in every API process.
- ``DELETE /api/sessions/{id}?wait=<seconds>``: forget the session everywhere
  (``turnlog.sinks.erasure_request``), audited as ``requested_by`` =
  ``api:<token id>`` (``auth.Scope.token_id``, never the token). 200
  ``{"session_id", "status": "done", "requested_at", "requested_by",
  "erased_at"}`` once the store holds nothing of it; 202 (``"status":
  "pending"``, ``erased_at`` null) when it is queued and not yet applied by
  ``wait`` (0..30, default 5; the broker or the sink away: it completes when
  they return); asking again is the same erasure. 404: no such session, or
  another fleet's (nothing changed); 503 with ``Retry-After``: the store did
  not answer (nothing queued; or the answer did not come in time: ask
  again); 429 with ``Retry-After`` past ``ERASURES_PER_TOKEN`` running.
- After it, ``GET /api/sessions/{id}`` and its ``transcript``, ``events`` and
  ``resume`` answer 410 ``{"session_id", "status": "erased"|"pending",
  "erased_at"}`` to a token of the session's fleet (404 to any other), and
  the session list leaves it out.
- ``GET /api/fleets/{fleet}/analytics``: the analytics projection's figures.
- ``GET /api/ops``: the operations page's figures (``turnlog.api.ops``): lag per
  group and partition, throughput, sessions open, and Prometheus' turn-to-store
  p50/p99, DLQ by reason, degraded recorders and spool fullness. They span every
  fleet, so only a token granting ``"*"`` reads them (403 for any other).
- ``POST /api/sessions/{id}/resume?timeout=<seconds>``: passes the resume
  barrier, claims the session's next epoch and returns the grant with the
  first page of stored turns (``turnlog.producers.grant``): how agents resume
  without database credentials (``turnlog.producers.api_client``). 409 if the
  session has ended, 503 with ``Retry-After`` if the pipeline did not catch up
  in time, 429 with ``Retry-After`` past the token's resume limit.

Bounds (docs/design.md, "API bounds"): every numeric input is range-checked
(422 for a query parameter, 400 for ``Last-Event-ID``; never 500); resumes are
limited per token (``api_resume_per_token``) and answer by their timeout even
while queued; live streams are capped globally and per token
(``api_max_streams``, ``api_max_streams_per_token``; 429 past them); pages are
bounded in rows and bytes (``api_page_bytes``).

Unauthenticated: ``GET /live`` with ``/live.js`` and ``/live.css`` (the live
transcript page; static, it holds no data and sends the token itself), ``GET /ops``
with ``/ops.js`` and ``/ops.css`` (the operations page, alike),
``GET /healthz``, and, only with ``api_docs``, ``/docs``, ``/redoc`` and
``/openapi.json``. Every response carries the headers of ``headers.py``.
"""

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from turnlog.api.auth import TokenTable
from turnlog.api.context import (
    MAX_SEQ,
    UNAVAILABLE_RETRY_AFTER_SECONDS,
    ApiContext,
    Barrier,
    SessionGone,
)
from turnlog.api.forgetting import ERASURE_WORKERS, ERASURES_PER_TOKEN, erasure_routes
from turnlog.api.headers import SecurityHeaders
from turnlog.api.limits import SlotLimiter
from turnlog.api.live import CUTOFF_EVENT, ERASED_EVENT, live_routes
from turnlog.api.operations import ops_routes
from turnlog.api.ops import OpsBoard
from turnlog.api.pages import page_routes
from turnlog.api.resuming import resume_routes
from turnlog.api.sessions import session_routes
from turnlog.crypto.ledger_signatures import ledger_signer
from turnlog.follow import TranscriptHub
from turnlog.kafka import BrokerUnavailableError
from turnlog.readiness import mark_not_ready, mark_ready
from turnlog.resume_barrier import ResumeBarrier
from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import SqlStore
from turnlog.sinks.exceptions import StoreError, StoreUnavailableError

__all__ = ["create_app", "CUTOFF_EVENT", "ERASED_EVENT", "ERASURES_PER_TOKEN", "MAX_SEQ",
           "UNAVAILABLE_RETRY_AFTER_SECONDS"]

_DOCS_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc")

logger = logging.getLogger(__name__)


def create_app(
    settings: TurnlogSettings,
    store: SqlStore,
    *,
    live: bool = True,
    barrier: Barrier | None = None,
    ops: OpsBoard | None = None,
) -> FastAPI:
    """The API over ``store``. ``live=False`` runs without the transcript hub
    (followers then see new events from the store, ``api_poll_seconds`` late).
    ``barrier`` replaces the resume barrier over ``settings`` and ``store`` (tests);
    ``ops`` the operations page's board (``OpsBoard.for_settings``; tests pass their own).

    With ``settings.ready_file`` set, the ready file (:mod:`turnlog.readiness`,
    component ``api``) is written once the hub follows the transcript topic
    (without a hub: at start-up), and removed at shutdown.

    Raises:
        ConfigurationError: ``erasure_issuers`` is set and this host holds no issuer key they trust.
    """
    tokens = TokenTable(settings.api_tokens)
    if ledger_signer(settings) is None:  # ConfigurationError: erasures this API wrote would be refused
        logger.warning(
            "TURNLOG_ERASURE_ISSUERS is empty: the erasures this API writes are not signed, and every reader "
            "takes any erasure ledger record (open mode; docs/security.md, 'Erasure issuers')"
        )
    if settings.epoch_grant_key is None:
        logger.warning(
            "TURNLOG_EPOCH_GRANT_KEY is not set: resumes are granted without a signed epoch grant, which a "
            "sequencer with TURNLOG_FLEET_KEYS refuses (fine in open mode; docs/design.md, 'Write-side isolation')"
        )
    context = ApiContext(
        settings=settings,
        store=store,
        tokens=tokens,
        hub=TranscriptHub(settings, store=store, on_following=lambda: mark_ready(settings.ready_file, "api"))
        if live else None,
        barrier=barrier if barrier is not None else ResumeBarrier(settings, store),
        board=ops if ops is not None else OpsBoard.for_settings(settings, store),
        resume_workers=ThreadPoolExecutor(max_workers=settings.api_resume_workers,
                                          thread_name_prefix="turnlog-resume"),
        # Running or queued resumes; their number is bounded per token, so all of them by the token count.
        resumes=SlotLimiter(settings.api_resume_per_token * max(1, len(tokens)), settings.api_resume_per_token),
        streams=SlotLimiter(settings.api_max_streams, settings.api_max_streams_per_token),
        erasure_workers=ThreadPoolExecutor(max_workers=ERASURE_WORKERS, thread_name_prefix="turnlog-erasure"),
        erasure_slots=SlotLimiter(ERASURES_PER_TOKEN * max(1, len(tokens)), ERASURES_PER_TOKEN),
    )
    hub = context.hub

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if hub is not None:
            hub.start()
        else:
            mark_ready(settings.ready_file, "api")
        try:
            yield
        finally:
            context.resume_workers.shutdown(wait=False, cancel_futures=True)
            context.erasure_workers.shutdown(wait=False, cancel_futures=True)
            context.barrier.close()
            context.board.close()
            if hub is not None:
                await asyncio.to_thread(hub.stop)
            mark_not_ready(settings.ready_file)  # after the hub's thread, which may mark it ready

    docs = settings.api_docs
    app = FastAPI(
        title="turnlog",
        summary="Sessions, transcripts and live events of turnlog's store.",
        lifespan=lifespan,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.add_middleware(SecurityHeaders, docs_paths=_DOCS_PATHS)

    # One place for outages, whichever route met them: a client gets 503 and when to try
    # again, never a raw 500 (the store's reading()/writing() decide by class and SQLSTATE).
    def unavailable(what: str, error: Exception) -> JSONResponse:
        logger.warning("answered 503, the %s is unavailable: %s", what, error)
        return JSONResponse(
            {"detail": f"the {what} is unavailable; try again"},
            status_code=503,
            headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_SECONDS)},
        )

    @app.exception_handler(StoreUnavailableError)
    async def store_unavailable(_: Request, error: StoreUnavailableError) -> JSONResponse:
        return unavailable("store", error)

    @app.exception_handler(SessionGone)
    async def session_gone(_: Request, gone: SessionGone) -> JSONResponse:
        return JSONResponse(gone.body(), status_code=410, headers={"Cache-Control": "no-store"})

    @app.exception_handler(BrokerUnavailableError)
    async def broker_unavailable(_: Request, error: BrokerUnavailableError) -> JSONResponse:
        return unavailable("broker", error)

    # Any other store error (a data error in a query, a missing table, a permission): a bug or a
    # broken deployment, answered as JSON with the security headers; the log names its class only.
    @app.exception_handler(StoreError)
    async def store_failed(request: Request, error: StoreError) -> JSONResponse:
        logger.error("%s %s failed: %s", request.method, request.url.path, type(error).__name__)
        return JSONResponse({"detail": "internal error"}, status_code=500, headers={"Cache-Control": "no-store"})

    for routes in (page_routes, ops_routes, session_routes, live_routes, resume_routes, erasure_routes):
        app.include_router(routes(context))
    return app
