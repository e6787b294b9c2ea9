"""The HTTP API (FastAPI, served by uvicorn: ``turnlog api``).

Routes (all under ``/api`` need ``Authorization: Bearer <token>``, see ``auth.py``):

- ``GET /api/sessions``: ``{"sessions": [...], "next_cursor": id | null}``;
  filters ``status``, ``fleet``, ``started_after``, ``started_before`` (ISO 8601,
  UTC if no offset), paging by ``limit`` (1..500, default 50) and ``cursor``.
- ``GET /api/sessions/{id}``: the session row: status, durable position
  (``last_seq``: every seq up to it is stored), aggregates once finalized.
- ``GET /api/sessions/{id}/transcript``: ``{"session": ..., "turns": [...]}`` in turn order;
  each turn has ``status`` (``partial``, ``complete``, ``interrupted``) and
  ``barged_in`` (a complete turn the other speaker cut short).
- ``GET /api/sessions/{id}/events``: Server-Sent Events, one per applied event:
  ``id`` = seq, ``event`` = type, ``data`` = the event's JSON as it crossed
  Kafka. Resumes after ``Last-Event-ID`` (which wins) or ``?after=<seq>``;
  backlog from the store, then the live tail (``turnlog.follow``). Ends after
  ``session.ended``.
- ``GET /api/fleets/{fleet}/analytics``: the analytics projection's figures.
- ``POST /api/sessions/{id}/resume?timeout=<seconds>``: passes the resume
  barrier, claims the session's next epoch and returns the grant with the
  stored turns (``turnlog.producers.grant``): how agents resume without
  database credentials (``turnlog.producers.api_client``). 409 if the session
  has ended, 503 with ``Retry-After`` if the pipeline did not catch up in time.

Unauthenticated: ``GET /live`` (the live transcript page; static, it holds no
data and sends the token itself) and ``GET /healthz``.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route
# signatures at definition time, and ``Scoped`` is local to create_app.


import asyncio
import datetime as dt
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy.exc import DBAPIError
from sse_starlette import EventSourceResponse, ServerSentEvent

from turnlog.api.auth import Scope, TokenTable
from turnlog.follow import TranscriptHub, follow_session, store_fetch
from turnlog.kafka import BrokerUnavailableError
from turnlog.producers.exceptions import ResumeBarrierTimeout
from turnlog.producers.grant import MAX_RESUME_TIMEOUT_SECONDS, ResumeGrant, encode_grant
from turnlog.producers.resume import ResumeBarrier
from turnlog.readiness import mark_not_ready, mark_ready
from turnlog.schemas import SessionStatus
from turnlog.settings import TurnlogSettings
from turnlog.sinks.analytics import AnalyticsProjection
from turnlog.sinks.base import SqlStore
from turnlog.sinks.errors import store_errors
from turnlog.sinks.exceptions import StoreUnavailableError
from turnlog.sinks.reads import get_session, get_turns, list_sessions

__all__ = ["create_app"]

SESSION_STATUSES = tuple(status.value for status in SessionStatus)
SSE_PING_SECONDS = 15
#: Resume barriers run at once (each holds a thread; they share two broker clients);
#: more requests queue, and their time in the queue counts against their timeout.
RESUME_WORKERS = 8
#: ``Retry-After`` of a 503 from the resume endpoint (seconds).
RESUME_RETRY_AFTER_SECONDS = 2
#: ``Retry-After`` of a 503 when the store or the broker is away (seconds).
UNAVAILABLE_RETRY_AFTER_SECONDS = 5

logger = logging.getLogger(__name__)


def create_app(settings: TurnlogSettings, store: SqlStore, *, live: bool = True) -> FastAPI:
    """The API over ``store``. ``live=False`` runs without the transcript hub
    (followers then see new events from the store, ``api_poll_seconds`` late).

    With ``settings.ready_file`` set, the ready file (:mod:`turnlog.readiness`,
    component ``api``) is written once the hub follows the transcript topic
    (without a hub: at start-up), and removed at shutdown.
    """
    tokens = TokenTable(settings.api_tokens)
    hub = TranscriptHub(settings, on_following=lambda: mark_ready(settings.ready_file, "api")) if live else None
    barrier = ResumeBarrier(settings, store)
    resume_workers = ThreadPoolExecutor(max_workers=RESUME_WORKERS, thread_name_prefix="turnlog-resume")

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
            barrier.close()
            if hub is not None:
                await asyncio.to_thread(hub.stop)
            mark_not_ready(settings.ready_file)  # after the hub's thread, which may mark it ready

    app = FastAPI(title="turnlog", summary="Sessions, transcripts and live events of turnlog's store.",
                  lifespan=lifespan)

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

    @app.exception_handler(BrokerUnavailableError)
    async def broker_unavailable(_: Request, error: BrokerUnavailableError) -> JSONResponse:
        return unavailable("broker", error)

    @app.exception_handler(DBAPIError)
    async def database_error(request: Request, error: DBAPIError) -> JSONResponse:
        try:
            with store_errors():
                raise error
        except StoreUnavailableError as converted:
            return unavailable("store", converted)
        except Exception:  # not an outage: a bug, reported as one
            logger.exception("%s %s failed", request.method, request.url.path)
            return JSONResponse({"detail": "internal error"}, status_code=500)

    def scope(authorization: Annotated[str | None, Header()] = None) -> Scope:
        granted = tokens.scope_of(authorization)
        if granted is None:
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        return granted

    Scoped = Annotated[Scope, Depends(scope)]

    def visible_session(session_id: str, granted: Scope) -> dict[str, Any]:
        if "\x00" in session_id:  # no stored id holds one (and Postgres text cannot)
            raise HTTPException(404, "no such session")
        with store.engine.connect() as conn:
            session = get_session(conn, session_id, fleets=granted.fleets)
        if session is None:  # also outside the token's fleets: never confirm it exists
            raise HTTPException(404, f"no session {session_id!r}")
        return session

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, Any]:
        return {"ok": True, "live_subscribers": hub.subscriber_count if hub is not None else None}

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/live")

    @app.get("/live", response_class=HTMLResponse, include_in_schema=False)
    def live_page() -> str:
        return resources.files("turnlog.api").joinpath("static/live.html").read_text("utf-8")

    @app.get("/api/sessions")
    def sessions_list(
        granted: Scoped,
        status: Annotated[str | None, Query(pattern="^(" + "|".join(SESSION_STATUSES) + ")$")] = None,
        fleet: str | None = None,
        started_after: dt.datetime | None = None,
        started_before: dt.datetime | None = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        _no_nul(fleet=fleet, cursor=cursor)
        with store.engine.connect() as conn:
            rows = list_sessions(
                conn,
                fleets=granted.fleets,
                status=status,
                fleet=fleet,
                started_after=_as_utc("started_after", started_after),
                started_before=_as_utc("started_before", started_before),
                after_id=cursor,
                limit=limit + 1,  # one more: is there a next page?
            )
        more = len(rows) > limit
        rows = rows[:limit]
        return {"sessions": rows, "next_cursor": rows[-1]["id"] if more else None}

    @app.get("/api/sessions/{session_id}")
    def session_detail(session_id: str, granted: Scoped) -> dict[str, Any]:
        return visible_session(session_id, granted)

    @app.get("/api/sessions/{session_id}/transcript")
    def session_transcript(session_id: str, granted: Scoped) -> dict[str, Any]:
        session = visible_session(session_id, granted)
        with store.engine.connect() as conn:
            turns = get_turns(conn, session_id)
        return {"session": session, "turns": turns}

    @app.get("/api/sessions/{session_id}/events")
    async def session_stream(
        session_id: str,
        request: Request,
        granted: Scoped,
        after: Annotated[int | None, Query(ge=-1)] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> Response:
        await asyncio.to_thread(visible_session, session_id, granted)
        resume_after = after if after is not None else -1
        if last_event_id:
            try:
                resume_after = int(last_event_id)
            except ValueError:
                raise HTTPException(400, "Last-Event-ID must be a seq (an integer)") from None

        fetch = store_fetch(store)
        first = await fetch(session_id, resume_after)
        if first.finished and not first.events:
            # Nothing can follow: 204 tells an EventSource to stop reconnecting.
            return Response(status_code=204)

        async def stream() -> AsyncIterator[ServerSentEvent]:
            async for event in follow_session(
                fetch, hub, session_id, resume_after, poll_seconds=settings.api_poll_seconds
            ):
                yield ServerSentEvent(data=event.payload, id=str(event.seq), event=event.type)
                # Let sse-starlette's disconnect watcher run between events, so a
                # backlog is not written on into a closed connection.
                await asyncio.sleep(0)

        return EventSourceResponse(stream(), ping=SSE_PING_SECONDS, headers={"Cache-Control": "no-store"})

    @app.post("/api/sessions/{session_id}/resume")
    async def session_resume(
        session_id: str,
        granted: Scoped,
        timeout: Annotated[float | None, Query(gt=0, le=MAX_RESUME_TIMEOUT_SECONDS)] = None,
    ) -> Response:
        """Resume a session: pass the resume barrier, claim its next epoch, and
        return the :class:`~turnlog.producers.grant.ResumeGrant` (epoch, stored
        position, stored turns in ``turn_index`` order) as JSON.

        This claims an epoch: it is a POST, not idempotent. A retry (after a
        lost response, say) claims again, which is safe: the newer epoch fences
        the older one, and the unused one is never written in.

        ``timeout``: longest wait at the barrier (seconds, at most
        ``MAX_RESUME_TIMEOUT_SECONDS``; default ``resume_timeout_seconds``),
        counted from the request's arrival, including any wait for one of the
        ``RESUME_WORKERS`` barrier threads. 404: no such session, or one
        outside the token's fleets (answered after the same barrier, so a token
        learns nothing about other fleets); 409: the session has ended, was
        finalized or abandoned (nothing claimed); 503 with ``Retry-After``: the
        sequencer, the sink, the broker or the store did not catch up in time.
        """
        if "\x00" in session_id:  # no stored id holds one (and Postgres text cannot)
            raise HTTPException(404, "no such session")
        wait = timeout if timeout is not None else min(settings.resume_timeout_seconds, MAX_RESUME_TIMEOUT_SECONDS)
        deadline = time.monotonic() + wait

        def claim() -> ResumeGrant | None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ResumeBarrierTimeout(f"resume of {session_id}: no free resume worker within {wait:g}s")
            return barrier.grant(session_id, left, fleets=granted.fleets)

        try:
            grant = await asyncio.get_running_loop().run_in_executor(resume_workers, claim)
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
        logger.info("resume of %s granted: epoch %d, %d stored turns", session_id, grant.epoch, len(grant.turns))
        return Response(encode_grant(grant), media_type="application/json", headers={"Cache-Control": "no-store"})

    @app.get("/api/fleets/{fleet}/analytics")
    def fleet_analytics(
        fleet: str, granted: Scoped, minutes: Annotated[int, Query(ge=1, le=1440)] = 60
    ) -> dict[str, Any]:
        if not granted.allows(fleet) or "\x00" in fleet:
            raise HTTPException(404, f"no fleet {fleet!r}")
        with store.engine.connect() as conn:
            figures = AnalyticsProjection(store).figures(conn, fleet, minutes=minutes)
        return {
            "fleet": figures.fleet,
            "active_sessions": figures.active_sessions,
            "started_sessions": figures.started_sessions,
            "ended_sessions": figures.ended_sessions,
            "turns_per_minute": [{"minute": minute, "turns": n} for minute, n in figures.turns_per_minute],
            "talk_time": {s: {"turns": n, "seconds": secs} for s, (n, secs) in figures.talk_time.items()},
        }

    return app


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
