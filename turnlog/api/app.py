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

# No ``from __future__ import annotations`` here: FastAPI reads the route
# signatures at definition time, and ``Scoped`` is local to create_app.


import asyncio
import datetime as dt
import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any, Protocol, TypeVar

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from turnlog import metrics
from turnlog.api.auth import Scope, TokenTable
from turnlog.api.headers import SecurityHeaders
from turnlog.api.limits import SlotLimiter
from turnlog.api.ops import OpsBoard
from turnlog.follow import FollowerFellBehind, SessionErased, TranscriptHub, follow_session, store_fetch
from turnlog.kafka import BrokerUnavailableError
from turnlog.producers.exceptions import ResumeBarrierTimeout, SessionErasedError
from turnlog.producers.grant import MAX_RESUME_TIMEOUT_SECONDS, RESUME_TURN_PAGE, ResumeGrant, encode_grant
from turnlog.producers.resume import ResumeBarrier, record_resume
from turnlog.readiness import mark_not_ready, mark_ready
from turnlog.schemas import SessionStatus
from turnlog.settings import TurnlogSettings
from turnlog.sinks.access import StoreReads
from turnlog.sinks.base import SqlStore
from turnlog.sinks.erasure import ErasureState
from turnlog.sinks.erasure_request import ErasureNotFound, ErasureOutcome, request_erasure
from turnlog.sinks.exceptions import StoreUnavailableError
from turnlog.sinks.reads import MAX_TURN_INDEX

__all__ = ["create_app", "CUTOFF_EVENT", "ERASED_EVENT", "MAX_SEQ"]

SESSION_STATUSES = tuple(status.value for status in SessionStatus)
SSE_PING_SECONDS = 15
#: ``Retry-After`` of a 503 from the resume endpoint (seconds).
RESUME_RETRY_AFTER_SECONDS = 2
#: ``Retry-After`` of a 503 when the store or the broker is away (seconds).
UNAVAILABLE_RETRY_AFTER_SECONDS = 5
#: ``Retry-After`` of a 429 past a resume limit (seconds): a resume of a caught-up pipeline takes milliseconds.
RESUME_BUSY_RETRY_AFTER_SECONDS = 1
#: How long past its deadline a running resume may take to give its own answer (seconds).
RESUME_GRACE_SECONDS = 1.0
#: ``Retry-After`` of a 429 past a live stream cap (seconds).
STREAMS_BUSY_RETRY_AFTER_SECONDS = 5
#: The SSE event that ends a stream whose client fell behind (it carries no ``id``).
CUTOFF_EVENT = "stream.cutoff"
#: The SSE event that ends a stream whose session is forgotten (it carries no ``id``).
ERASED_EVENT = "session.erased"
#: Erasures one token may have running or queued (a DELETE past it: 429).
ERASURES_PER_TOKEN = 2
#: Threads that run erasure requests (each blocks on the store, the broker and the sink).
ERASURE_WORKERS = 4
#: A DELETE's default and longest wait for the sink to apply the erasure (seconds).
ERASURE_WAIT_DEFAULT_SECONDS, ERASURE_WAIT_MAX_SECONDS = 5.0, 30.0
#: How long past its wait a DELETE waits for an erasure not yet queued in the store (seconds).
ERASURE_GRACE_SECONDS = 2.0
#: ``Retry-After`` of a 429 past the erasure limit, and of a 503 when no answer came in time (seconds).
ERASURE_RETRY_AFTER_SECONDS = 2
#: Highest seq a request may name (the store's seq column is a signed 64-bit integer).
MAX_SEQ = 2**63 - 1
#: Longest id the store holds (session, fleet: 200 characters); a longer one names nothing.
MAX_ID_LENGTH = 200
SESSIONS_PAGE_DEFAULT, SESSIONS_PAGE_MAX = 20, 100
TURNS_PAGE_DEFAULT, TURNS_PAGE_MAX = 100, RESUME_TURN_PAGE
#: ``Last-Event-ID`` as the API sends it: a seq, in decimal (int() alone would take "1_0" and " 7").
_SEQ_TEXT = re.compile(r"-?[0-9]{1,19}")
_DOCS_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc")

logger = logging.getLogger(__name__)
T = TypeVar("T")


class SessionGone(Exception):
    """A session the caller may see is forgotten (``state.status`` done) or being forgotten: 410."""

    def __init__(self, state: ErasureState) -> None:
        super().__init__(f"session {state.session_id} is forgotten")
        self.state = state

    def body(self) -> dict[str, Any]:
        status = "erased" if self.state.status == "done" else "pending"
        erased_at = self.state.completed_at.isoformat() if self.state.completed_at is not None else None
        return {"session_id": self.state.session_id, "status": status, "erased_at": erased_at}


class Barrier(Protocol):
    """What the API needs of :class:`~turnlog.producers.resume.ResumeBarrier` (tests pass their own)."""

    def grant(
        self,
        session_id: str,
        timeout: float,
        *,
        fleets: Collection[str] | None = None,
        turn_limit: int | None = None,
        max_bytes: int | None = None,
    ) -> ResumeGrant | None: ...

    def close(self) -> None: ...


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
    """
    tokens = TokenTable(settings.api_tokens)
    if settings.epoch_grant_key is None:
        logger.warning(
            "TURNLOG_EPOCH_GRANT_KEY is not set: resumes are granted without a signed epoch grant, which a "
            "sequencer with TURNLOG_FLEET_KEYS refuses (fine in open mode; docs/design.md, 'Write-side isolation')"
        )
    hub = (
        TranscriptHub(settings, store=store, on_following=lambda: mark_ready(settings.ready_file, "api"))
        if live else None
    )
    resume_barrier: Barrier = barrier if barrier is not None else ResumeBarrier(settings, store)
    resume_workers = ThreadPoolExecutor(max_workers=settings.api_resume_workers, thread_name_prefix="turnlog-resume")
    # Running or queued resumes; their number is bounded per token, so all of them by the token count.
    resumes = SlotLimiter(settings.api_resume_per_token * max(1, len(tokens)), settings.api_resume_per_token)
    streams = SlotLimiter(settings.api_max_streams, settings.api_max_streams_per_token)
    erasure_workers = ThreadPoolExecutor(max_workers=ERASURE_WORKERS, thread_name_prefix="turnlog-erasure")
    erasure_slots = SlotLimiter(ERASURES_PER_TOKEN * max(1, len(tokens)), ERASURES_PER_TOKEN)
    static = {
        name: resources.files("turnlog.api").joinpath(f"static/{name}").read_text("utf-8")
        for name in ("live.html", "live.js", "live.css", "ops.html", "ops.js", "ops.css")
    }
    board = ops if ops is not None else OpsBoard.for_settings(settings, store)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if hub is not None:
            hub.start()
        else:
            mark_ready(settings.ready_file, "api")
        try:
            yield
        finally:
            resume_workers.shutdown(wait=False, cancel_futures=True)
            erasure_workers.shutdown(wait=False, cancel_futures=True)
            resume_barrier.close()
            board.close()
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

    # One place for outages, whichever call site met them: a client gets 503 and
    # when to try again, never a raw 500 (decided by exception class and SQLSTATE).
    def unavailable(what: str, error: Exception) -> JSONResponse:
        logger.warning("%s unavailable: %s", what, error)
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

    def scope(authorization: Annotated[str | None, Header()] = None) -> Scope:
        granted = tokens.scope_of(authorization)
        if granted is None:
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        return granted

    Scoped = Annotated[Scope, Depends(scope)]
    Include = Annotated[str | None, Query(pattern="^metadata$", description="`metadata`: include each session's")]

    def refuse_if_erased(reads: StoreReads, session_id: str, granted: Scope) -> None:
        """Raises SessionGone (410) for a forgotten session of the token's fleets, HTTPException(404)
        for another fleet's; nothing for a session without an erasure."""
        erased = reads.erasure_state(session_id)
        if erased is not None:
            if granted.allows(erased.fleet):
                raise SessionGone(erased)
            raise HTTPException(404, f"no session {session_id!r}")

    def visible_session(session_id: str, granted: Scope, *, include_metadata: bool = True) -> dict[str, Any]:
        if not _may_exist(session_id):
            raise HTTPException(404, "no such session")
        with store.reading() as reads:
            refuse_if_erased(reads, session_id, granted)
            session = reads.session(session_id, fleets=granted.fleets, include_metadata=include_metadata)
        if session is None:  # also outside the token's fleets: never confirm it exists
            raise HTTPException(404, f"no session {session_id!r}")
        return session

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, Any]:
        return {"ok": True, "live_subscribers": hub.subscriber_count if hub is not None else None}

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/live")

    @app.get("/live", include_in_schema=False)
    def live_page() -> Response:
        return Response(static["live.html"], media_type="text/html; charset=utf-8",
                        headers={"Cache-Control": "no-cache"})

    @app.get("/live.js", include_in_schema=False)
    def live_script() -> Response:
        return Response(static["live.js"], media_type="text/javascript; charset=utf-8",
                        headers={"Cache-Control": "no-cache"})

    @app.get("/live.css", include_in_schema=False)
    def live_style() -> Response:
        return Response(static["live.css"], media_type="text/css; charset=utf-8", headers={"Cache-Control": "no-cache"})

    @app.get("/ops", include_in_schema=False)
    def ops_page() -> Response:
        return Response(static["ops.html"], media_type="text/html; charset=utf-8",
                        headers={"Cache-Control": "no-cache"})

    @app.get("/ops.js", include_in_schema=False)
    def ops_script() -> Response:
        return Response(static["ops.js"], media_type="text/javascript; charset=utf-8",
                        headers={"Cache-Control": "no-cache"})

    @app.get("/ops.css", include_in_schema=False)
    def ops_style() -> Response:
        return Response(static["ops.css"], media_type="text/css; charset=utf-8", headers={"Cache-Control": "no-cache"})

    @app.get("/api/ops")
    async def ops_figures(granted: Scoped) -> JSONResponse:
        """The operations page's figures (``turnlog.api.ops.OpsBoard``; each with a ``state``).
        Read at most once per ``ops_refresh_seconds`` whatever the number of clients; answered
        within about ``OPS_SOURCE_TIMEOUT_SECONDS`` even when Kafka, the store or Prometheus
        hangs (then with that figure's ``state`` ``timeout``). 403: the token does not grant
        every fleet (``"*"``): these figures span all of them."""
        if granted.fleets is not None:
            raise HTTPException(403, "the operations figures span every fleet: they need a token granting \"*\"")
        return JSONResponse(await board.figures(), headers={"Cache-Control": "no-store"})

    @app.get("/api/sessions")
    def sessions_list(
        granted: Scoped,
        status: Annotated[str | None, Query(pattern="^(" + "|".join(SESSION_STATUSES) + ")$")] = None,
        fleet: Annotated[str | None, Query(max_length=MAX_ID_LENGTH)] = None,
        started_after: dt.datetime | None = None,
        started_before: dt.datetime | None = None,
        limit: Annotated[int, Query(ge=1, le=SESSIONS_PAGE_MAX)] = SESSIONS_PAGE_DEFAULT,
        cursor: Annotated[str | None, Query(max_length=MAX_ID_LENGTH)] = None,
        include: Include = None,
    ) -> dict[str, Any]:
        _no_nul(fleet=fleet, cursor=cursor)
        with store.reading() as reads:
            rows, more = reads.sessions(
                fleets=granted.fleets,
                status=status,
                fleet=fleet,
                started_after=_as_utc("started_after", started_after),
                started_before=_as_utc("started_before", started_before),
                after_id=cursor,
                limit=limit,
                include_metadata=include == "metadata",
                max_bytes=settings.api_page_bytes,
            )
        return {"sessions": rows, "next_cursor": rows[-1]["id"] if more else None}

    @app.get("/api/sessions/{session_id}")
    def session_detail(session_id: str, granted: Scoped) -> dict[str, Any]:
        return visible_session(session_id, granted)

    @app.get("/api/sessions/{session_id}/transcript")
    def session_transcript(
        session_id: str,
        granted: Scoped,
        after_turn: Annotated[int, Query(ge=-1, le=MAX_TURN_INDEX)] = -1,
        limit: Annotated[int, Query(ge=1, le=TURNS_PAGE_MAX)] = TURNS_PAGE_DEFAULT,
        include: Include = None,
    ) -> dict[str, Any]:
        session = visible_session(session_id, granted, include_metadata=include == "metadata")
        with store.reading() as reads:
            page = reads.turn_page(session_id, after_turn=after_turn, limit=limit, max_bytes=settings.api_page_bytes)
        return {"session": session, "turns": page.turns, "next_after_turn": page.next_after_turn}

    @app.get("/api/sessions/{session_id}/events")
    async def session_stream(
        session_id: str,
        granted: Scoped,
        after: Annotated[int | None, Query(ge=-1, le=MAX_SEQ)] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> Response:
        resume_after = _resume_point(after, last_event_id)
        key = granted.token_number
        if not streams.try_acquire(key):
            raise HTTPException(
                429,
                "too many live streams open (for this token, or in all); retry later",
                headers={"Retry-After": str(STREAMS_BUSY_RETRY_AFTER_SECONDS)},
            )
        release = _once(lambda: streams.release(key))
        try:
            await asyncio.to_thread(visible_session, session_id, granted, include_metadata=False)
            fetch = store_fetch(store, max_bytes=settings.api_page_bytes)
            try:
                first = await fetch(session_id, resume_after)
            except SessionErased:  # forgotten since the look above: answered as that look would now
                await asyncio.to_thread(visible_session, session_id, granted, include_metadata=False)
                raise
        except BaseException:
            release()
            raise
        if first.finished and not first.events:
            # Nothing can follow: 204 tells an EventSource to stop reconnecting.
            release()
            return Response(status_code=204)

        async def stream() -> AsyncIterator[ServerSentEvent]:
            try:
                async for event in follow_session(
                    fetch,
                    hub,
                    session_id,
                    resume_after,
                    poll_seconds=settings.api_poll_seconds,
                    queue_bytes=settings.api_stream_queue_bytes,
                    cut_off_when_behind=True,
                ):
                    yield ServerSentEvent(data=event.payload, id=str(event.seq), event=event.type)
                    # Let sse-starlette's disconnect watcher run between events, so a
                    # backlog is not written on into a closed connection.
                    await asyncio.sleep(0)
            except FollowerFellBehind as behind:
                logger.info("live stream of %s cut off after seq %d: its client reads slower than the session "
                            "writes", session_id, behind.last_seq)
                cutoff = {"reason": "slow_client", "last_event_id": str(behind.last_seq)}
                yield ServerSentEvent(data=json.dumps(cutoff), event=CUTOFF_EVENT)
            except SessionErased:
                logger.info("live stream of %s ended: the session is forgotten", session_id)
                yield ServerSentEvent(data=json.dumps({"session_id": session_id}), event=ERASED_EVENT)

        return _BoundedEventStream(
            stream(),
            session_id=session_id,
            on_close=release,
            ping=SSE_PING_SECONDS,
            send_timeout=settings.api_stream_send_timeout_seconds,
            headers={"Cache-Control": "no-store"},
        )

    @app.post("/api/sessions/{session_id}/resume")
    async def session_resume(
        session_id: str,
        granted: Scoped,
        timeout: Annotated[float | None, Query(gt=0, le=MAX_RESUME_TIMEOUT_SECONDS)] = None,
    ) -> Response:
        """Resume a session: pass the resume barrier, claim its next epoch, and
        return the :class:`~turnlog.producers.grant.ResumeGrant` (epoch, stored
        position, the first page of stored turns in ``turn_index`` order; when
        more turns are stored, ``next_after_turn`` says where the transcript's
        pages continue) as JSON.

        This claims an epoch: it is a POST, not idempotent. A retry (after a
        lost response, say) claims again, which is safe: the newer epoch fences
        the older one, and the unused one is never written in.

        ``timeout``: longest wait (seconds, at most ``MAX_RESUME_TIMEOUT_SECONDS``;
        default ``resume_timeout_seconds``), counted from the request's
        arrival, including any wait for one of the ``api_resume_workers``
        barrier threads: the answer comes by then (a request still queued is
        cancelled and never runs; a running one has ``RESUME_GRACE_SECONDS``
        more to give its own answer). 404: no such session, or one outside the
        token's fleets (answered alike; see ``ResumeBarrier.grant``); 409: the
        session has ended, was finalized or abandoned (nothing claimed); 410: the
        session is forgotten or being forgotten (to its fleet; 404 to any other); 429
        with ``Retry-After``: the token already has ``api_resume_per_token``
        resumes running or queued; 503 with ``Retry-After``: the sequencer, the
        sink, the broker or the store did not catch up in time.
        """
        if not _may_exist(session_id):
            raise HTTPException(404, "no such session")
        wait = timeout if timeout is not None else min(settings.resume_timeout_seconds, MAX_RESUME_TIMEOUT_SECONDS)
        started = time.monotonic()
        deadline = started + wait
        key = granted.token_number
        if not resumes.try_acquire(key):
            raise HTTPException(
                429,
                f"this token already has {settings.api_resume_per_token} resumes in progress; retry later",
                headers={"Retry-After": str(RESUME_BUSY_RETRY_AFTER_SECONDS)},
            )

        def claim() -> ResumeGrant | None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ResumeBarrierTimeout(f"resume of {session_id}: no free resume worker within {wait:g}s")
            with store.reading() as reads:  # a forgotten session is never claimed again
                try:
                    refuse_if_erased(reads, session_id, granted)
                except SessionGone:  # refused before the barrier, which records every other resume
                    record_resume("erased", started)
                    raise
            try:
                return resume_barrier.grant(
                    session_id, left, fleets=granted.fleets, turn_limit=RESUME_TURN_PAGE,
                    max_bytes=settings.api_page_bytes,
                )
            except SessionErasedError:  # its erasure was asked for while it waited at the barrier
                with store.reading() as reads:
                    refuse_if_erased(reads, session_id, granted)
                raise HTTPException(404, f"no session {session_id!r}") from None  # an erasure row is never removed

        # The slot is the worker's until it finishes, or, while queued, until it is cancelled below.
        work, outcome = _run_in_slot(resume_workers, claim, resumes, key, RESUME_RETRY_AFTER_SECONDS)
        try:
            done, _ = await asyncio.wait({outcome}, timeout=max(0.0, deadline - time.monotonic()))
            if not done and not work.cancel():
                # Running: the barrier keeps the same deadline, so its own answer (a grant, or its
                # timeout naming what it waited for) is due now; it gets a moment to give it.
                done, _ = await asyncio.wait({outcome}, timeout=RESUME_GRACE_SECONDS)
        except asyncio.CancelledError:  # the client went away: a queued resume need not run
            work.cancel()
            raise
        try:
            if not done:
                raise ResumeBarrierTimeout(
                    f"resume of {session_id}: no resume worker was free within {wait:g}s"
                    if work.cancelled() else f"resume of {session_id}: still at the barrier at its {wait:g}s deadline"
                )
            grant = outcome.result()
        except ResumeBarrierTimeout as e:
            logger.warning("resume of %s: %s", session_id, e)  # the detail (groups, offsets) stays in the log
            raise HTTPException(
                503,
                f"the pipeline did not catch up within {wait:g}s; retry later",
                headers={"Retry-After": str(RESUME_RETRY_AFTER_SECONDS)},
            ) from None
        if grant is None:
            raise HTTPException(404, f"no session {session_id!r}")
        if not grant.resumable:
            raise HTTPException(409, f"session {session_id!r} is {grant.status}; it cannot be resumed")
        logger.info("resume of %s granted: epoch %d, %d stored turns in its first page%s", session_id, grant.epoch,
                    len(grant.turns), "" if grant.next_after_turn is None else " (more follow)")
        return Response(encode_grant(grant), media_type="application/json", headers={"Cache-Control": "no-store"})

    @app.delete("/api/sessions/{session_id}")
    async def session_forget(
        session_id: str,
        granted: Scoped,
        wait: Annotated[float | None, Query(ge=0, le=ERASURE_WAIT_MAX_SECONDS)] = None,
    ) -> JSONResponse:
        """Forget a session everywhere (docs/design.md, "Encryption and erasure"): its rows in
        the store, its figures, its live streams in every API process, and what every reader
        of the log, spool and replay would give of it.

        The request (``turnlog.sinks.erasure_request.request_erasure``) runs on one of
        ``ERASURE_WORKERS`` threads, scoped by the token's fleets and audited as
        ``requested_by`` = ``api:<token id>`` (``Scope.token_id``; never the token).
        ``wait``: seconds (0..``ERASURE_WAIT_MAX_SECONDS``, default
        ``ERASURE_WAIT_DEFAULT_SECONDS``) to wait for the sink to apply it; the answer
        comes by ``wait`` plus ``ERASURE_GRACE_SECONDS``.

        200 ``{"session_id", "status": "done", "requested_at", "requested_by",
        "erased_at"}``: the store holds nothing of it. 202, the same with ``"status":
        "pending"`` and ``erased_at`` null: queued (in the store; its ledger record
        written, or left for the sink to write when the broker is back), not applied
        yet. Asking again is the same erasure (the first request's ``requested_by``
        and ``requested_at`` stand). 404: no such session or another fleet's, alike;
        nothing changed. 503 with ``Retry-After``: the store did not answer (nothing
        queued), or no answer came in time (ask again to learn where it stands). 429
        with ``Retry-After``: the token has ``ERASURES_PER_TOKEN`` erasures running or
        queued.
        """
        if not _may_exist(session_id):
            raise HTTPException(404, "no such session")
        deadline = time.monotonic() + (ERASURE_WAIT_DEFAULT_SECONDS if wait is None else wait)
        key = granted.token_number
        if not erasure_slots.try_acquire(key):
            raise HTTPException(
                429, f"this token already has {ERASURES_PER_TOKEN} erasures in progress; retry later",
                headers={"Retry-After": str(ERASURE_RETRY_AFTER_SECONDS)},
            )
        requested_by = f"api:{granted.token_id}"
        recorded: Future[ErasureOutcome] = Future()  # set once the erasure is queued: it will complete

        def forget() -> ErasureOutcome:
            return request_erasure(settings, store, session_id, requested_by=requested_by, fleets=granted.fleets,
                                   wait_seconds=max(0.0, deadline - time.monotonic()),
                                   on_recorded=recorded.set_result)

        work, answer = _run_in_slot(erasure_workers, forget, erasure_slots, key, ERASURE_RETRY_AFTER_SECONDS)
        try:
            done, _ = await asyncio.wait(
                {answer}, timeout=max(0.0, deadline - time.monotonic()) + ERASURE_GRACE_SECONDS
            )
        except asyncio.CancelledError:  # the client went away: a queued request need not run
            work.cancel()
            raise
        outcome: ErasureOutcome | None = None
        if done:
            try:
                outcome = answer.result()
            except ErasureNotFound:
                raise HTTPException(404, f"no session {session_id!r}") from None
            except Exception as error:
                if not recorded.done():
                    raise  # nothing queued: the store's outage is a 503 (its handler), anything else a 500
                logger.warning("erasure of %s: queued, then %s; the sink completes it", session_id,
                               type(error).__name__)
        elif work.cancel() or not recorded.done():
            # Never started (every erasure worker busy), or the store has not answered yet: the
            # erasure may or may not be queued; asking again is safe and tells.
            raise HTTPException(
                503, "the erasure could not be confirmed in time; ask again",
                headers={"Retry-After": str(ERASURE_RETRY_AFTER_SECONDS)},
            )
        if outcome is None:
            outcome = recorded.result()
        logger.info("erasure of %s requested by %s: %s", session_id, outcome.requested_by, outcome.status)
        body = {
            "session_id": outcome.session_id,
            "status": outcome.status,
            "requested_at": outcome.requested_at.isoformat(),
            "requested_by": outcome.requested_by,
            "erased_at": outcome.completed_at.isoformat() if outcome.completed_at is not None else None,
        }
        return JSONResponse(body, status_code=200 if outcome.status == "done" else 202,
                            headers={"Cache-Control": "no-store"})

    @app.get("/api/fleets/{fleet}/analytics")
    def fleet_analytics(
        fleet: str, granted: Scoped, minutes: Annotated[int, Query(ge=1, le=1440)] = 60
    ) -> dict[str, Any]:
        if not granted.allows(fleet) or not _may_exist(fleet):
            raise HTTPException(404, f"no fleet {fleet!r}")
        with store.reading() as reads:
            figures = reads.fleet_figures(fleet, minutes=minutes)
        return {
            "fleet": figures.fleet,
            "active_sessions": figures.active_sessions,
            "started_sessions": figures.started_sessions,
            "ended_sessions": figures.ended_sessions,
            "turns_per_minute": [{"minute": minute, "turns": n} for minute, n in figures.turns_per_minute],
            "talk_time": {s: {"turns": n, "seconds": secs} for s, (n, secs) in figures.talk_time.items()},
        }

    return app


class _BoundedEventStream(EventSourceResponse):
    """An SSE response that gives its live-stream slot back however it ends (``on_close``), and
    treats a client that accepts nothing for ``send_timeout`` seconds as gone. Counted in
    ``turnlog_api_live_streams`` while it is being served."""

    def __init__(self, content: AsyncIterator[ServerSentEvent], *, session_id: str, on_close: Callable[[], None],
                 **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._session_id = session_id
        self._on_close = on_close

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        metrics.API_LIVE_STREAMS.inc()
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:
            logger.warning("live stream of %s closed: its client accepted nothing for %gs", self._session_id,
                           self.send_timeout)
        finally:
            metrics.API_LIVE_STREAMS.dec()
            self._on_close()


def _once(action: Callable[[], None]) -> Callable[[], None]:
    """``action``, run by the first call only (thread-safe)."""
    done = threading.Event()
    lock = threading.Lock()

    def run() -> None:
        with lock:
            if done.is_set():
                return
            done.set()
        action()

    return run


def _run_in_slot(
    workers: ThreadPoolExecutor, work: Callable[[], T], slots: SlotLimiter, key: int, retry_after: int
) -> tuple[Future[T], asyncio.Future[T]]:
    """Run ``work`` on ``workers`` in a slot of ``slots`` already acquired for ``key``: the slot
    is released when it finishes, or is cancelled while queued. Returns the worker's future and
    its awaitable, whose outcome is read even once nobody waits for it.

    Raises:
        HTTPException: 503 with ``Retry-After: retry_after``: the executor is shut down (the
            API is stopping); the slot is released.
    """
    try:
        future = workers.submit(work)
    except RuntimeError:
        slots.release(key)
        raise HTTPException(503, "the API is stopping; retry", headers={"Retry-After": str(retry_after)}) from None
    future.add_done_callback(lambda _: slots.release(key))
    awaitable = asyncio.wrap_future(future)
    awaitable.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future, awaitable


def _may_exist(identifier: str) -> bool:
    """Whether the store could hold this session or fleet id: none holds a NUL (Postgres text
    cannot) or is longer than the column."""
    return "\x00" not in identifier and len(identifier) <= MAX_ID_LENGTH


def _resume_point(after: int | None, last_event_id: str | None) -> int:
    """The seq a stream resumes after: ``Last-Event-ID`` (which wins) or ``after``, default -1.
    Raises HTTPException(400) for a ``Last-Event-ID`` that is not a seq in -1..MAX_SEQ."""
    if last_event_id:
        text = last_event_id.strip()
        if not _SEQ_TEXT.fullmatch(text) or not -1 <= int(text) <= MAX_SEQ:
            raise HTTPException(400, f"Last-Event-ID must be a seq, an integer from -1 to {MAX_SEQ}")
        return int(text)
    return after if after is not None else -1


def _as_utc(name: str, value: dt.datetime | None) -> dt.datetime | None:
    """``value`` in UTC (naive means UTC). Raises HTTPException(422) if it has no UTC equivalent."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise HTTPException(422, f"{name} is out of range once converted to UTC") from None


def _no_nul(**values: str | None) -> None:
    """Raises HTTPException(422) for a NUL character (the store's text columns cannot hold one)."""
    for name, value in values.items():
        if value is not None and "\x00" in value:
            raise HTTPException(422, f"{name} contains a NUL character")
