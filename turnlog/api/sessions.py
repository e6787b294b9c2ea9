"""The store's reads over HTTP: ``GET /api/sessions`` (a keyset page), ``/api/sessions/{id}``
(the row), ``/api/sessions/{id}/transcript`` (a page of turns) and
``/api/fleets/{fleet}/analytics`` (the analytics projection's figures). Bounds and
answers: the module docstring of :mod:`turnlog.api.app`."""

# No ``from __future__ import annotations``: FastAPI reads the route signatures at definition time.

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query

from turnlog.api.auth import Scope
from turnlog.api.context import MAX_FLEET_LENGTH, MAX_ID_LENGTH, ApiContext, as_utc, may_exist, no_nul
from turnlog.producers.grant import RESUME_TURN_PAGE
from turnlog.schemas import SessionStatus
from turnlog.sinks.reads import MAX_TURN_INDEX

__all__ = ["session_routes"]

SESSION_STATUSES = tuple(status.value for status in SessionStatus)
SESSIONS_PAGE_DEFAULT, SESSIONS_PAGE_MAX = 20, 100
TURNS_PAGE_DEFAULT, TURNS_PAGE_MAX = 100, RESUME_TURN_PAGE


def session_routes(context: ApiContext) -> APIRouter:
    """The read routes over ``context``'s store."""
    router = APIRouter()
    store, settings = context.store, context.settings
    Scoped = Annotated[Scope, Depends(context.scope)]
    Include = Annotated[str | None, Query(pattern="^metadata$", description="`metadata`: include each session's")]

    @router.get("/api/sessions")
    def sessions_list(
        granted: Scoped,
        status: Annotated[str | None, Query(pattern="^(" + "|".join(SESSION_STATUSES) + ")$")] = None,
        fleet: Annotated[str | None, Query(max_length=MAX_FLEET_LENGTH)] = None,
        started_after: dt.datetime | None = None,
        started_before: dt.datetime | None = None,
        limit: Annotated[int, Query(ge=1, le=SESSIONS_PAGE_MAX)] = SESSIONS_PAGE_DEFAULT,
        cursor: Annotated[str | None, Query(max_length=MAX_ID_LENGTH)] = None,
        include: Include = None,
    ) -> dict[str, Any]:
        no_nul(fleet=fleet, cursor=cursor)
        with store.reading() as reads:
            rows, more = reads.sessions(
                fleets=granted.fleets,
                status=status,
                fleet=fleet,
                started_after=as_utc("started_after", started_after),
                started_before=as_utc("started_before", started_before),
                after_id=cursor,
                limit=limit,
                include_metadata=include == "metadata",
                max_bytes=settings.api_page_bytes,
            )
        return {"sessions": rows, "next_cursor": rows[-1]["id"] if more else None}

    @router.get("/api/sessions/{session_id}")
    def session_detail(session_id: str, granted: Scoped) -> dict[str, Any]:
        return context.visible_session(session_id, granted)

    @router.get("/api/sessions/{session_id}/transcript")
    def session_transcript(
        session_id: str,
        granted: Scoped,
        after_turn: Annotated[int, Query(ge=-1, le=MAX_TURN_INDEX)] = -1,
        limit: Annotated[int, Query(ge=1, le=TURNS_PAGE_MAX)] = TURNS_PAGE_DEFAULT,
        include: Include = None,
    ) -> dict[str, Any]:
        session, page = context.visible_session_and(
            session_id, granted, include_metadata=include == "metadata",
            read=lambda reads: reads.turn_page(session_id, after_turn=after_turn, limit=limit,
                                               max_bytes=settings.api_page_bytes),
        )
        assert page is not None  # read for every session that is visible
        return {"session": session, "turns": page.turns, "next_after_turn": page.next_after_turn}

    @router.get("/api/fleets/{fleet}/analytics")
    def fleet_analytics(
        fleet: str, granted: Scoped, minutes: Annotated[int, Query(ge=1, le=1440)] = 60
    ) -> dict[str, Any]:
        if not granted.allows(fleet) or not may_exist(fleet):
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

    return router
