"""What every route of the API shares: the store, the token table, the worker pools and
limits, and the checks each answer starts with (who asks, whether the session exists for
them, whether it is forgotten). :func:`turnlog.api.app.create_app` builds one
:class:`ApiContext`; each concern's module (``sessions``, ``live``, ``resuming``,
``forgetting``, ``pages``, ``ops``) makes its routes from it."""

import asyncio
import datetime as dt
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any, Protocol, TypeVar

from fastapi import Header, HTTPException

from turnlog.api.auth import Scope, TokenTable
from turnlog.api.limits import SlotLimiter
from turnlog.api.ops import OpsBoard
from turnlog.follow import TranscriptHub
from turnlog.producers.grant import ResumeGrant
from turnlog.schemas.session_keys import MAX_SESSION_KEY
from turnlog.settings import TurnlogSettings
from turnlog.sinks.access import StoreReads
from turnlog.sinks.base import SqlStore
from turnlog.sinks.erasure import ErasureState

__all__ = ["ApiContext", "Barrier", "SessionGone", "MAX_ID_LENGTH", "MAX_FLEET_LENGTH", "MAX_SEQ",
           "UNAVAILABLE_RETRY_AFTER_SECONDS", "may_exist", "run_in_slot", "as_utc", "no_nul"]

#: ``Retry-After`` of a 503 when the store or the broker is away (seconds).
UNAVAILABLE_RETRY_AFTER_SECONDS = 5
#: Highest seq a request may name (the store's seq column is a signed 64-bit integer).
MAX_SEQ = 2**63 - 1
#: Longest session id the store holds (a session key: 265 characters); a longer one names nothing.
MAX_ID_LENGTH = MAX_SESSION_KEY
#: Longest fleet name (200 characters, as the event schema's names).
MAX_FLEET_LENGTH = 200
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
    """What the API needs of :class:`~turnlog.resume_barrier.ResumeBarrier` (tests pass their own)."""

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


@dataclass(frozen=True, slots=True)
class ApiContext:
    """One API process's shared parts. ``hub`` is None without the live transcript hub;
    ``resumes``, ``streams`` and ``erasure_slots`` bound the work per token and in all."""

    settings: TurnlogSettings
    store: SqlStore
    tokens: TokenTable
    hub: TranscriptHub | None
    barrier: Barrier
    board: OpsBoard
    resume_workers: ThreadPoolExecutor
    resumes: SlotLimiter
    streams: SlotLimiter
    erasure_workers: ThreadPoolExecutor
    erasure_slots: SlotLimiter

    def scope(self, authorization: Annotated[str | None, Header()] = None) -> Scope:
        """The FastAPI dependency of every ``/api`` route: the bearer token's scope.

        Raises:
            HTTPException: 401 (with ``WWW-Authenticate``) for a missing or unknown token.
        """
        granted = self.tokens.scope_of(authorization)
        if granted is None:
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        return granted

    @staticmethod
    def refuse_if_erased(reads: StoreReads, session_id: str, granted: Scope, fleet: str | None = None) -> None:
        """Raises SessionGone (410) for a forgotten session: of ``fleet`` (the stored session's) if
        given, else of the token's fleets; nothing without one. An erasure is bound to its fleet:
        another fleet's erasure of the same id is not this session's, nor the token's business."""
        erased = reads.erasure_state(session_id, [fleet] if fleet is not None else granted.fleets)
        if erased is not None and granted.allows(erased.fleet):
            raise SessionGone(erased)

    def visible_session(self, session_id: str, granted: Scope, *, include_metadata: bool = True) -> dict[str, Any]:
        """The session's row as ``granted`` may see it.

        Raises:
            HTTPException: 404 for no such session, or one outside the token's fleets (alike).
            SessionGone: it is forgotten or being forgotten (410).
        """
        session, _ = self.visible_session_and(session_id, granted, include_metadata=include_metadata)
        return session

    def visible_session_and(
        self, session_id: str, granted: Scope, *, include_metadata: bool = True,
        read: Callable[[StoreReads], T] | None = None,
    ) -> tuple[dict[str, Any], T | None]:
        """:meth:`visible_session`, and ``read(reads)`` in the same transaction (None without it).

        The erasure check comes after the reads: an erasure committed before they began is seen
        by it (each statement sees what was committed when it began), so nothing forgotten is
        answered; one committed after them finds what was read before it.

        Raises:
            HTTPException: 404 for no such session, or one outside the token's fleets (alike).
            SessionGone: it is forgotten or being forgotten (410).
        """
        if not may_exist(session_id):
            raise HTTPException(404, "no such session")
        with self.store.reading() as reads:
            session = reads.session(session_id, fleets=granted.fleets, include_metadata=include_metadata)
            extra = read(reads) if read is not None and session is not None else None
            self.refuse_if_erased(reads, session_id, granted, session["fleet"] if session is not None else None)
        if session is None:  # also outside the token's fleets: never confirm it exists
            raise HTTPException(404, f"no session {session_id!r}")
        return session, extra


def may_exist(identifier: str) -> bool:
    """Whether the store could hold this session key or fleet name: none holds a NUL (Postgres
    text cannot) or is longer than :data:`MAX_ID_LENGTH` (the longest key; a fleet's column is
    shorter, and a longer fleet is simply not found)."""
    return "\x00" not in identifier and len(identifier) <= MAX_ID_LENGTH


def run_in_slot(
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


def as_utc(name: str, value: dt.datetime | None) -> dt.datetime | None:
    """``value`` in UTC (naive means UTC). Raises HTTPException(422) if it has no UTC equivalent."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise HTTPException(422, f"{name} is out of range once converted to UTC") from None


def no_nul(**values: str | None) -> None:
    """Raises HTTPException(422) for a NUL character (the store's text columns cannot hold one)."""
    for name, value in values.items():
        if value is not None and "\x00" in value:
            raise HTTPException(422, f"{name} contains a NUL character")
