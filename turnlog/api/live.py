"""``GET /api/sessions/{id}/events``: a session's applied events as Server-Sent Events, the
backlog from the store and then the live tail (``turnlog.follow``), bounded per token and
in all (``api_max_streams``, ``api_max_streams_per_token``). Ends after ``session.ended``,
with :data:`CUTOFF_EVENT` when the client reads slower than the session writes, or with
:data:`ERASED_EVENT` when the session is forgotten while followed."""

# No ``from __future__ import annotations``: FastAPI reads the route signatures at definition time.

import asyncio
import json
import logging
import re
import threading
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query
from fastapi.responses import Response
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from turnlog import metrics
from turnlog.api.auth import Scope
from turnlog.api.context import MAX_SEQ, ApiContext
from turnlog.follow import FollowerFellBehind, SessionErased, follow_session, store_fetch

__all__ = ["live_routes", "CUTOFF_EVENT", "ERASED_EVENT"]

logger = logging.getLogger(__name__)
SSE_PING_SECONDS = 15
#: ``Retry-After`` of a 429 past a live stream cap (seconds).
STREAMS_BUSY_RETRY_AFTER_SECONDS = 5
#: The SSE event that ends a stream whose client fell behind (it carries no ``id``).
CUTOFF_EVENT = "stream.cutoff"
#: The SSE event that ends a stream whose session is forgotten (it carries no ``id``).
ERASED_EVENT = "session.erased"
#: ``Last-Event-ID`` as the API sends it: a seq, in decimal (int() alone would take "1_0" and " 7").
_SEQ_TEXT = re.compile(r"-?[0-9]{1,19}")


def live_routes(context: ApiContext) -> APIRouter:
    """The live event stream over ``context``'s store and transcript hub."""
    router = APIRouter()
    store, settings, streams = context.store, context.settings, context.streams
    Scoped = Annotated[Scope, Depends(context.scope)]

    @router.get("/api/sessions/{session_id}/events")
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
            await asyncio.to_thread(context.visible_session, session_id, granted, include_metadata=False)
            fetch = store_fetch(store, max_bytes=settings.api_page_bytes)
            try:
                first = await fetch(session_id, resume_after)
            except SessionErased:  # forgotten since the look above: answered as that look would now
                await asyncio.to_thread(context.visible_session, session_id, granted, include_metadata=False)
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
                    context.hub,
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

    return router


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


def _resume_point(after: int | None, last_event_id: str | None) -> int:
    """The seq a stream resumes after: ``Last-Event-ID`` (which wins) or ``after``, default -1.
    Raises HTTPException(400) for a ``Last-Event-ID`` that is not a seq in -1..MAX_SEQ."""
    if last_event_id:
        text = last_event_id.strip()
        if not _SEQ_TEXT.fullmatch(text) or not -1 <= int(text) <= MAX_SEQ:
            raise HTTPException(400, f"Last-Event-ID must be a seq, an integer from -1 to {MAX_SEQ}")
        return int(text)
    return after if after is not None else -1
