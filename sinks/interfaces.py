"""The store's small interfaces: one per job, and the values that cross them.

The SQL store (:class:`~turnlog.sinks.base.SqlStore`) does four jobs over one
engine; each lives in its own module behind one of these interfaces:

- offsets in the rows' transaction: :class:`OffsetTracking` (``sinks/offsets.py``);
- the transcript's rows, idempotent upserts: a :data:`BatchWriter`
  (``sinks/transcript.py``);
- finalization: :class:`Finalization` (``sinks/finalization.py``);
- resume claims: :class:`ResumeClaims` (``sinks/claims.py``).

Every method takes the caller's connection and never commits: the caller's
``engine.begin()`` block is the transaction: its scope is explicit, as in
``eventsourcing``'s recorders. The order of work inside one batch's transaction (rows, then
finalization, then offsets) is stated in ``sinks/base.py``.

The implementations get the backend through :class:`Dialect` (the three hooks
``postgres.py`` and ``sqlite.py`` supply), so none of them knows which
database it runs on.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.engine import Connection
from sqlalchemy.sql import Select

from turnlog.sinks.batch import WriteResult
from turnlog.sinks.source_records import SourceMessage

__all__ = [
    "BatchResult",
    "BatchWriter",
    "Dialect",
    "Finalization",
    "OffsetTracking",
    "OnRejected",
    "ResumeClaims",
    "SessionPosition",
    "WriteResult",
]


#: Writes the rows of a batch's fresh records in the caller's transaction and
#: says which records it refused and which sessions it finalized
#: (``OffsetTracking.apply_tracked``). The transcript writer
#: (``sinks/transcript.py``) and the analytics projection (``sinks/analytics.py``) are two.
BatchWriter = Callable[[Connection, Sequence[SourceMessage]], WriteResult]

#: Called with a record a writer refused and the reason, before the offsets move past it.
OnRejected = Callable[[SourceMessage, str], None]


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What :meth:`SqlStore.apply_batch` did: counts of records, and the sessions
    it finalized (in its transaction: they are finalized once that commits);
    ``turns_emitted_at`` and ``ended_at`` as the writer's ``WriteResult`` gave them."""

    applied: int
    stale: int
    rejected: int
    finalized: tuple[str, ...] = ()
    turns_emitted_at: tuple[dt.datetime, ...] = ()
    ended_at: Mapping[str, dt.datetime] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionPosition:
    """A session's durable position in the store (the resume point)."""

    session_id: str
    status: str
    epoch: int
    last_seq: int
    max_turn_index: int | None


class Dialect(Protocol):
    """The backend's three hooks (``postgres.py``, ``sqlite.py``)."""

    def insert(self, table: Any) -> Any:
        """The dialect's ``INSERT`` construct with ``on_conflict_do_*``."""
        ...

    def lock(self, query: Select[Any]) -> Select[Any]:
        """``query`` with row locks held to the end of the transaction."""
        ...

    def pipeline(self, conn: Connection) -> AbstractContextManager[None]:
        """A block whose statements may be sent without waiting for each result
        (Postgres' pipeline mode: one round trip for the lot), for writes whose
        results and row counts are never read. Their errors are raised by the
        end of the block, as SQLAlchemy ``DBAPIError`` subclasses."""
        ...


class OffsetTracking(Protocol):
    """Tracking records: the consumed offsets (``sink_offsets``), written in the
    transaction of the rows they cover, so a replayed record is recognised as
    one (as ``eventsourcing``'s tracking records are)."""

    def stored_offsets(
        self, conn: Connection, consumer_group: str, partitions: Iterable[tuple[str, int]], *, lock: bool = False
    ) -> dict[tuple[str, int], int]:
        """``{(topic, partition): next offset}`` stored for ``consumer_group``."""
        ...

    def apply_tracked(
        self,
        conn: Connection,
        consumer_group: str | None,
        messages: Sequence[SourceMessage],
        write: BatchWriter,
        *,
        on_rejected: OnRejected | None = None,
        fences: Mapping[tuple[str, int], int] | None = None,
    ) -> BatchResult:
        """Lock the offsets (checking ``fences``), drop records below them, ``write`` the rest,
        move the offsets past the batch."""
        ...

    def skip_records(
        self, conn: Connection, consumer_group: str, messages: Sequence[SourceMessage], *,
        fences: Mapping[tuple[str, int], int] | None = None,
    ) -> None:
        """Move the offsets past ``messages`` without writing their rows."""
        ...

    def claim_partitions(
        self, conn: Connection, consumer_group: str, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        """Raise the partitions' fencing tokens for a sink just assigned them; the tokens now held."""
        ...


class Finalization(Protocol):
    """The guarded finalize: a session's aggregates, computed once from its persisted rows."""

    def finalize_session(self, conn: Connection, session_id: str, finalized_at: dt.datetime) -> bool:
        """True if this call finalized ``session_id``."""
        ...

    def finalize_ready(self, conn: Connection, session_ids: Sequence[str]) -> tuple[str, ...]:
        """The guarded finalize of each of ``session_ids``; those it finalized."""
        ...

    def finalizable_sessions(self, conn: Connection, limit: int = 100) -> list[str]:
        """Ids of sessions ended and complete in the store but not finalized."""
        ...


class ResumeClaims(Protocol):
    """The store side of a resume: where a session stands, and the next epoch handed out."""

    def session_position(self, conn: Connection, session_id: str) -> SessionPosition | None:
        """Where ``session_id`` stands in the store, or None if it has no row."""
        ...

    def claim_epoch(self, conn: Connection, session_id: str) -> tuple[int, SessionPosition] | None:
        """Hand out the next epoch of an active session, atomically (row lock)."""
        ...
