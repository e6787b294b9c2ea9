"""``POST /api/sessions/{id}/resume``: pass the resume barrier, claim the session's next epoch
and answer the grant with the first page of stored turns: how agents resume without database
credentials (``turnlog.producers.api_client``). Bounded per token (``api_resume_per_token``)
and answered by its timeout even while queued."""

# No ``from __future__ import annotations``: FastAPI reads the route signatures at definition time.

import asyncio
import logging
import time
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import Response

from turnlog.api.auth import Scope
from turnlog.api.context import ApiContext, SessionGone, may_exist, run_in_slot
from turnlog.producers.exceptions import ResumeBarrierTimeout, SessionErasedError
from turnlog.producers.grant import MAX_RESUME_TIMEOUT_SECONDS, RESUME_TURN_PAGE, ResumeGrant, encode_grant
from turnlog.resume_barrier import record_resume

__all__ = ["resume_routes"]

logger = logging.getLogger(__name__)
#: ``Retry-After`` of a 503 from the resume endpoint (seconds).
RESUME_RETRY_AFTER_SECONDS = 2
#: ``Retry-After`` of a 429 past a resume limit (seconds): a resume of a caught-up pipeline takes milliseconds.
RESUME_BUSY_RETRY_AFTER_SECONDS = 1
#: How long past its deadline a running resume may take to give its own answer (seconds).
RESUME_GRACE_SECONDS = 1.0


def resume_routes(context: ApiContext) -> APIRouter:
    """The resume route over ``context``'s barrier and store."""
    router = APIRouter()
    store, settings = context.store, context.settings
    Scoped = Annotated[Scope, Depends(context.scope)]

    @router.post("/api/sessions/{session_id}/resume")
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
        if not may_exist(session_id):
            raise HTTPException(404, "no such session")
        wait = timeout if timeout is not None else min(settings.resume_timeout_seconds, MAX_RESUME_TIMEOUT_SECONDS)
        started = time.monotonic()
        deadline = started + wait
        key = granted.token_number
        if not context.resumes.try_acquire(key):
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
                    known = reads.session(session_id, fleets=granted.fleets, include_metadata=False)
                    context.refuse_if_erased(reads, session_id, granted, known["fleet"] if known is not None else None)
                except SessionGone:  # refused before the barrier, which records every other resume
                    record_resume("erased", started)
                    raise
            try:
                return context.barrier.grant(
                    session_id, left, fleets=granted.fleets, turn_limit=RESUME_TURN_PAGE,
                    max_bytes=settings.api_page_bytes,
                )
            except SessionErasedError:  # its erasure was asked for while it waited at the barrier
                with store.reading() as reads:
                    context.refuse_if_erased(reads, session_id, granted)
                raise HTTPException(404, f"no session {session_id!r}") from None  # an erasure row is never removed

        # The slot is the worker's until it finishes, or, while queued, until it is cancelled below.
        work, outcome = run_in_slot(context.resume_workers, claim, context.resumes, key, RESUME_RETRY_AFTER_SECONDS)
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

    return router
