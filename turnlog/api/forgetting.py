"""``DELETE /api/sessions/{id}``: forget a session everywhere (docs/design.md, "Encryption and
erasure"), scoped by the token's fleets, audited as ``api:<token id>``, bounded per token
(:data:`ERASURES_PER_TOKEN`)."""

# No ``from __future__ import annotations``: FastAPI reads the route signatures at definition time.

import asyncio
import logging
import time
from concurrent.futures import Future
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import JSONResponse

from turnlog.api.auth import Scope
from turnlog.api.context import ApiContext, may_exist, run_in_slot
from turnlog.sinks.erasure_request import ErasureNotFound, ErasureOutcome, request_erasure

__all__ = ["erasure_routes", "ERASURES_PER_TOKEN", "ERASURE_WORKERS"]

logger = logging.getLogger(__name__)
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


def erasure_routes(context: ApiContext) -> APIRouter:
    """The erasure route over ``context``'s store."""
    router = APIRouter()
    store, settings = context.store, context.settings
    Scoped = Annotated[Scope, Depends(context.scope)]

    @router.delete("/api/sessions/{session_id}")
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
        if not may_exist(session_id):
            raise HTTPException(404, "no such session")
        deadline = time.monotonic() + (ERASURE_WAIT_DEFAULT_SECONDS if wait is None else wait)
        key = granted.token_number
        if not context.erasure_slots.try_acquire(key):
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

        work, answer = run_in_slot(
            context.erasure_workers, forget, context.erasure_slots, key, ERASURE_RETRY_AFTER_SECONDS
        )
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

    return router
