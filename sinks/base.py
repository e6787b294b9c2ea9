"""The SQL store: one transaction per batch, rows and offsets together.

:class:`SqlStore` is the abstract store: the backends (``postgres.py``,
``sqlite.py``) supply the dialect's ``INSERT ... ON CONFLICT`` construct,
row locking and pipelined writes (:class:`~turnlog.sinks.interfaces.Dialect`), and the store's four
jobs each live in a module of their own, behind a small interface
(``sinks/interfaces.py``):

- :attr:`SqlStore.offsets`: the consumed offsets, in the rows' transaction
  (``sinks/offsets.py``, :class:`~turnlog.sinks.interfaces.OffsetTracking`);
- :attr:`SqlStore.transcript`: the transcript's rows, idempotent upserts
  (``sinks/transcript.py``, a :data:`~turnlog.sinks.interfaces.BatchWriter`);
- :attr:`SqlStore.finalization`: the guarded finalize (``sinks/finalization.py``,
  :class:`~turnlog.sinks.interfaces.Finalization`);
- :attr:`SqlStore.claims`: resume claims (``sinks/claims.py``,
  :class:`~turnlog.sinks.interfaces.ResumeClaims`).

Callers outside ``sinks/`` open a transaction with :meth:`SqlStore.reading` or
:meth:`SqlStore.writing`, which convert driver errors to turnlog's own
(``sinks/driver_errors.py``), and call the named operations they hand out
(``sinks/access.py``); they never hold a connection. The methods below that
take a connection are the operations of the jobs, for the sink's own
transactions and the named operations; each hands its work to the job that
owns it, and none commits.

Order inside :meth:`SqlStore.apply_batch` (one transaction, so all or nothing):

1. lock this consumer group's ``sink_offsets`` rows for the batch's partitions
   and drop records below the stored offsets (a paused, zombie sink re-sending
   an old batch writes nothing) (offsets);
2. lock the batch's ``sessions`` rows and merge the batch into them (transcript);
3. insert ``session_events`` (dedupe by primary key ``(session_id, seq)``),
   upsert ``sessions`` (``last_seq`` = highest contiguous seq applied) and
   ``transcript_turns`` (under the ``(epoch, seq)`` and status guard), and
   mark partial turns ``interrupted`` when their writer's epoch is superseded
   or their session has ended: writes only, sent in one round trip where the
   backend can (:meth:`SqlStore.pipeline`) (transcript);
4. finalize every session of the batch that is now ended and complete: the
   guarded ``UPDATE`` of :meth:`SqlStore.finalize_session`, after the rows (finalization);
5. move ``sink_offsets`` forward (never backward) (offsets).

Finalization sits in the batch's transaction (docs/design.md, "Guarantees":
finalize once, exactly-once effect in the store). The aggregates are computed in SQL from
the rows this transaction just wrote, never from running totals; the guard
(``status = 'ended' AND last_seq >= end_seq``) matches once, and the offsets
of the ``session.ended`` (or of the record that closed the session's last gap)
commit with it. A crash before the commit loses the rows, the aggregates and
the offsets together and the batch is applied again; a re-delivered batch is
below the stored offsets, or finds the session ``finalized`` already and
matches nothing. No moment exists where a committed session is ended and
complete but not finalized, and no second consumer of the transcript is needed
to find the ``session.ended``. The finalizer service remains as a sweep for
stores written otherwise (``sinks/sweep.py``).

The Kafka consumer (``sinks/service.py``) never commits offsets to Kafka; on
partition assignment it seeks to the offsets stored here.
"""

from __future__ import annotations

import abc
import contextlib
import datetime as dt
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.sql import Select

from turnlog.sinks.access import StoreReads, StoreWrites
from turnlog.sinks.batch import WriteResult
from turnlog.sinks.claims import SqlResumeClaims
from turnlog.sinks.driver_errors import store_errors
from turnlog.sinks.erasure import SqlErasures
from turnlog.sinks.exceptions import StoreUnavailableError
from turnlog.sinks.finalization import SqlFinalization, report_finalized
from turnlog.sinks.interfaces import (
    BatchResult,
    BatchWriter,
    Finalization,
    OffsetTracking,
    OnRejected,
    ResumeClaims,
    SessionPosition,
)
from turnlog.sinks.offsets import SqlOffsets
from turnlog.sinks.source_records import SourceMessage
from turnlog.sinks.transcript import TranscriptWriter

# BatchResult, BatchWriter, SessionPosition, WriteResult and report_finalized
# live in the job modules; they stay importable from here.
__all__ = ["SqlStore", "BatchResult", "BatchWriter", "SessionPosition", "WriteResult", "report_finalized"]


class SqlStore(abc.ABC):
    """Store operations over one SQLAlchemy engine. :meth:`reading` and :meth:`writing`
    open a transaction and hand out the named operations; the methods that take a
    connection never commit: the caller's transaction does.

    The jobs, each replaceable on its own (no I/O at construction):
    :attr:`offsets`, :attr:`transcript`, :attr:`finalization`, :attr:`claims`.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.offsets: OffsetTracking = SqlOffsets(self)
        self.finalization: Finalization = SqlFinalization()
        self.erasures = SqlErasures(self)
        self.transcript = TranscriptWriter(self, self.finalization, erasures=self.erasures)
        self.claims: ResumeClaims = SqlResumeClaims(self)

    # -- transactions --------------------------------------------------------
    @contextlib.contextmanager
    def reading(self) -> Iterator[StoreReads]:
        """A transaction for reads (``with store.reading() as reads:``), ended with the block.

        Raises:
            StoreUnavailableError: the database does not answer, or ended the transaction
                (connection lost, serialization failure, shutdown).
            RecordRejectedError: the database refused a value of a query.
        """
        with store_errors(), self.engine.connect() as conn:
            yield StoreReads(self, conn)

    @contextlib.contextmanager
    def writing(self) -> Iterator[StoreWrites]:
        """A transaction (``with store.writing() as writes:``), committed when the block ends
        without an exception and rolled back otherwise.

        Raises:
            StoreUnavailableError: as :meth:`reading`; then nothing of the block is committed.
            RecordRejectedError: the database refused rows of the block (SQLSTATE classes 22, 23).
        """
        with store_errors(), self.engine.begin() as conn:
            yield StoreWrites(self, conn)

    # -- the schema and the connections ---------------------------------------
    def upgrade_schema(self) -> None:
        """Bring the database to the newest schema (idempotent; ``turnlog migrate``).

        Raises:
            StoreUnavailableError: the database does not answer.
        """
        with store_errors():
            from turnlog.sinks.migrate import upgrade_to_head  # alembic: loaded by the commands that use it

            upgrade_to_head(self.engine)

    def require_schema(self) -> None:
        """Check that the schema is at the newest revision (:func:`~turnlog.sinks.migrate.require_head`).

        Raises:
            StoreUnavailableError: the database does not answer.
            StoreError: the schema is missing or older; the message says to run ``turnlog migrate``.
        """
        from turnlog.sinks.migrate import require_head

        require_head(self.engine)

    def wait_for_schema(self) -> None:
        """:meth:`require_schema`, waiting without limit while the database does not answer
        (:func:`~turnlog.sinks.migrate.wait_for_head`): a service started during an outage waits.

        Raises:
            StoreError: the schema is missing or older (not retried).
        """
        from turnlog.sinks.migrate import wait_for_head

        wait_for_head(self.engine)

    def answers(self) -> bool:
        """Whether the database answers a round trip now (a health check: never raises for an outage)."""
        try:
            with self.reading() as reads:
                reads.ping()
        except StoreUnavailableError:
            return False
        return True

    @property
    def location(self) -> str:
        """The store's URL for messages and logs, its password hidden."""
        from turnlog.sinks import safe_url

        return safe_url(self.engine.url)

    def close(self) -> None:
        """Close the pooled connections (the store can still be used: it connects again)."""
        self.engine.dispose()

    # -- dialect hooks -----------------------------------------------------
    @abc.abstractmethod
    def insert(self, table: Any) -> Any:
        """The dialect's ``INSERT`` construct with ``on_conflict_do_*``."""

    @abc.abstractmethod
    def lock(self, query: Select[Any]) -> Select[Any]:
        """``query`` with row locks held to the end of the transaction."""

    def pipeline(self, conn: Connection) -> AbstractContextManager[None]:
        """A block of writes sent without waiting for each result, where the backend
        can (:meth:`Dialect.pipeline <turnlog.sinks.interfaces.Dialect.pipeline>`);
        here, a plain block: each statement waits for its result."""
        return contextlib.nullcontext()

    # -- the batch (offsets + transcript + finalization) -------------------
    def apply_batch(
        self,
        conn: Connection,
        consumer_group: str | None,
        messages: Sequence[SourceMessage],
        *,
        on_rejected: OnRejected | None = None,
    ) -> BatchResult:
        """Write one batch of transcript records and their offsets, in ``conn``'s transaction.

        Records below the group's stored offset are skipped (counted ``stale``).
        Undecodable records are handed to ``on_rejected(message, reason)``
        before the offsets move past them (the sink dead-letters them there);
        without it they are logged. Applying the same batch twice leaves the
        store as applying it once. ``consumer_group=None`` writes the rows
        without reading or moving any offsets (``turnlog replay``).
        """
        return self.offsets.apply_tracked(
            conn, consumer_group, messages, self.write_transcript, on_rejected=on_rejected
        )

    def write_transcript(self, conn: Connection, messages: Sequence[SourceMessage]) -> WriteResult:
        """The transcript sink's :data:`BatchWriter`: the rows of ``messages`` (no
        offsets), then the finalize of the sessions they leave ended and complete
        (:meth:`TranscriptWriter.write <turnlog.sinks.transcript.TranscriptWriter.write>`)."""
        return self.transcript.write(conn, messages)

    def skip_records(
        self, conn: Connection, consumer_group: str, messages: Sequence[SourceMessage], *,
        fences: Mapping[tuple[str, int], int] | None = None,
    ) -> None:
        """Move the group's offsets past ``messages`` without writing their rows
        (for records dead-lettered by the sink).

        Raises:
            SinkFencedError: as :meth:`SqlOffsets.apply_tracked <turnlog.sinks.offsets.SqlOffsets.apply_tracked>`.
        """
        self.offsets.skip_records(conn, consumer_group, messages, fences=fences)

    def claim_partitions(
        self, conn: Connection, consumer_group: str, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        """Claim a sink's newly assigned partitions: their fencing tokens
        (:meth:`SqlOffsets.claim_partitions <turnlog.sinks.offsets.SqlOffsets.claim_partitions>`)."""
        return self.offsets.claim_partitions(conn, consumer_group, partitions)

    # -- reads ---------------------------------------------------------------
    def stored_offsets(
        self, conn: Connection, consumer_group: str, partitions: Iterable[tuple[str, int]], *, lock: bool = False
    ) -> dict[tuple[str, int], int]:
        """``{(topic, partition): next offset}`` stored for ``consumer_group``."""
        return self.offsets.stored_offsets(conn, consumer_group, partitions, lock=lock)

    # -- resume claims -------------------------------------------------------
    def session_position(self, conn: Connection, session_id: str) -> SessionPosition | None:
        """Where ``session_id`` stands in the store, or None if it has no row."""
        return self.claims.session_position(conn, session_id)

    def claim_epoch(self, conn: Connection, session_id: str) -> tuple[int, SessionPosition] | None:
        """Hand out the next epoch of an active session, atomically (row lock)
        (:meth:`SqlResumeClaims.claim_epoch <turnlog.sinks.claims.SqlResumeClaims.claim_epoch>`)."""
        return self.claims.claim_epoch(conn, session_id)

    # -- finalization --------------------------------------------------------
    def finalize_session(self, conn: Connection, session_id: str, finalized_at: dt.datetime) -> bool:
        """Compute a session's aggregates from its persisted rows, exactly once
        (:meth:`SqlFinalization.finalize_session <turnlog.sinks.finalization.SqlFinalization.finalize_session>`):
        True means this call finalized it."""
        return self.finalization.finalize_session(conn, session_id, finalized_at)

    def finalizable_sessions(self, conn: Connection, limit: int = 100) -> list[str]:
        """Ids of sessions that are ended and complete in the store but not finalized
        (none, once every batch is written by :meth:`write_transcript`; the
        finalizer's sweep looks for them)."""
        return self.finalization.finalizable_sessions(conn, limit)
