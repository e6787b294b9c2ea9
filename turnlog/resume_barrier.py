"""The resume barrier (docs/design.md, "Events"): before a new process continues a
session, every event its predecessor got acknowledged must be applied.

1. read the end offset E of the session's partition of ``<prefix>.events``;
2. wait until the sequencer's group has committed offset >= E there (Faust
   commits a record's offset only after the record's batch is acked, which
   is after everything it emitted is acknowledged in ``<prefix>.transcript``;
   see ``stream_processors/sequencer.py``);
3. read the end T of the same partition of ``<prefix>.transcript``: the offset after
   its last committed record (the sequencer writes in transactions, each ending in a
   marker no consumer is given: the high watermark may lie past every record);
4. wait until the sink's stored offset (``sink_offsets``, same transaction as
   the rows) is >= T;
5. in one transaction: claim the next epoch and read the session's position
   and stored turns (:func:`claim_resume`), which :meth:`ResumeBarrier.grant`
   returns as a :class:`~turnlog.producers.grant.ResumeGrant`.

This runs next to the store: in the API (``POST /api/sessions/{id}/resume``) for
agents that have only the broker and the API
(:class:`~turnlog.producers.api_client.ApiResumeSource`), or, on a host that holds
the store, in the recorder's process through :class:`StoreResumeSource`, which the
composition root hands to ``SessionRecorder(resume_source=...)``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type, retry_if_result, wait_exponential, wait_fixed

from turnlog import metrics
from turnlog.kafka import BrokerError, OffsetReader
from turnlog.producers.api_client import ApiResumeSource
from turnlog.producers.exceptions import ResumeBarrierTimeout, SessionErasedError
from turnlog.producers.grant import ResumeGrant, ResumeSource, StoredTurn
from turnlog.producers.partitioning import partition_for
from turnlog.schemas import SessionStatus
from turnlog.schemas.session_keys import bare_id, grants_as
from turnlog.settings import TurnlogSettings
from turnlog.signing import EpochGrant, issue_epoch_grant
from turnlog.sinks import SessionPosition, SqlStore, StoreError, StoreUnavailableError, open_store
from turnlog.sinks.access import StoreWrites

__all__ = ["ResumeBarrier", "StoreResumeSource", "resume_source_for", "claim_resume", "record_resume",
           "RESUME_OUTCOMES"]

logger = logging.getLogger(__name__)
POLL_INTERVAL_SECONDS = 0.05
FIRST_POLL_SECONDS = 0.005
_T = TypeVar("_T")
#: The ``outcome`` label of ``turnlog_resume_seconds``: the grant of an active session; the barrier's
#: timeout; a forgotten session; no such session or one no longer active (nothing claimed); anything else.
RESUME_OUTCOMES = ("granted", "timeout", "erased", "refused", "error")


def record_resume(outcome: str, started: float) -> None:
    """Observe one resume in ``turnlog_resume_seconds{outcome}``: ``time.monotonic()`` now minus
    ``started``. :meth:`ResumeBarrier.grant` records each of its calls; a caller that refuses a
    resume before the barrier (the API, for a forgotten session) records that one itself."""
    metrics.RESUME_SECONDS.labels(outcome if outcome in RESUME_OUTCOMES else "error").observe(
        time.monotonic() - started
    )


def claim_resume(
    writes: StoreWrites,
    session_id: str,
    *,
    fleets: Collection[str] | None = None,
    grant_key: str | None = None,
    turn_limit: int | None = None,
    max_bytes: int | None = None,
) -> ResumeGrant | None:
    """Claim the next epoch of ``session_id`` and read its stored turns, in the
    caller's transaction (``with store.writing() as writes``), so the turns
    are those of the position the epoch was claimed at.

    ``fleets`` scopes the claim (None: every fleet): a session outside it is
    answered as a missing one, and nothing is claimed. Only an ``active``
    session gets a claim; for the others the grant carries their status (see
    :meth:`SqlStore.claim_epoch`). Returns None if the store has no such
    session within ``fleets``. With ``grant_key`` (the epoch grant issuer's
    key), an active session's grant carries the signed epoch grant the
    sequencer admits the new epoch by (``turnlog/signing.py``).

    ``turn_limit`` (None: every turn) and ``max_bytes`` bound the turns read
    (:func:`~turnlog.sinks.reads.turn_page`); when more are stored, the grant's
    ``next_after_turn`` says where the rest starts (``producers/grant.py``).

    Raises:
        SessionErasedError: the session is being forgotten (its erasure is in the store, not
            applied yet): nothing is claimed and no turn is read, as the API answers 410.
        StoreUnavailableError: the store did not answer (from the caller's transaction).
    """
    session = writes.session(session_id, fleets=fleets, include_metadata=False)  # its fleet; no metadata
    if session is None:
        return None
    claimed = _claim_epoch(writes, session_id, session["fleet"])  # locks the session row to the transaction's end
    if claimed is None:
        return None
    epoch, position = claimed
    if turn_limit is None:
        rows, next_after_turn = writes.turns(session_id), None
    else:
        page = writes.turn_page(session_id, limit=turn_limit, max_bytes=max_bytes)
        rows, next_after_turn = page.turns, page.next_after_turn
    turns = tuple(StoredTurn.from_row(row) for row in rows)
    fleet = session["fleet"]
    signed = None
    if grant_key is not None and position.status == SessionStatus.ACTIVE:
        signed = issue_epoch_grant(
            grant_key, EpochGrant(fleet=fleet, session_id=session_id, epoch=epoch, from_seq=position.last_seq + 1)
        )
    return ResumeGrant(
        session_id=session_id,
        epoch=epoch,
        status=position.status,
        last_seq=position.last_seq,
        max_turn_index=position.max_turn_index,
        turns=turns,
        fleet=fleet,
        epoch_grant=signed,
        next_after_turn=next_after_turn,
    )


def _claim_epoch(writes: StoreWrites, session_id: str, fleet: str | None = None) -> tuple[int, SessionPosition] | None:
    """:meth:`SqlStore.claim_epoch`, refused for a session being forgotten: one whose erasure is
    in the store, applied or not (the API answers 410 for it). An erasure is bound to its
    fleet: with ``fleet`` (the stored session's), only that fleet's erasure of the id counts.

    Raises:
        SessionErasedError: an erasure of the session is in the store; nothing is claimed.
    """
    if writes.erasure_state(session_id, [fleet] if fleet is not None else None) is not None:
        raise SessionErasedError(session_id)
    return writes.claim_epoch(session_id)


class ResumeBarrier:
    """Blocking barrier; :meth:`grant` and :meth:`wait` are meant to run in a worker thread."""

    def __init__(self, settings: TurnlogSettings, store: SqlStore) -> None:
        self._settings = settings
        self._store = store
        # Made once and kept across resumes: a new client's first lookup can take most of a second.
        self._offsets = OffsetReader(settings)

    def grant(
        self,
        session_id: str,
        timeout: float,
        *,
        fleets: Collection[str] | None = None,
        turn_limit: int | None = None,
        max_bytes: int | None = None,
    ) -> ResumeGrant | None:
        """Pass the barrier for ``session_id``, then claim its next epoch and read
        its stored turns in one transaction (:func:`claim_resume`; ``turn_limit``
        and ``max_bytes`` bound the turns read, None: all).

        The scope comes first: before any barrier work the store is asked for the
        session within ``fleets``. One found there that is no longer active is
        answered at once (a status never goes back to active; nothing is
        claimed). One not found, whether missing or another fleet's (the two
        must look the same to the caller), still waits at the barrier: a session
        whose first events are in flight is not in the store yet. The claim then
        checks the scope again. The API bounds that wait per token.

        Returns None if the store has no such session (or none within
        ``fleets``; None: every fleet). A grant whose ``status`` is not
        ``active`` claimed nothing: the session cannot be resumed. A key
        ``<fleet>:<id>`` the store does not hold stands for that fleet's session
        ``<id>`` from before per-fleet keys, when the store holds one: the grant
        then names the bare id (``schemas/session_keys.py``, ``grants_as``).

        Each call is recorded in ``turnlog_resume_seconds`` (:func:`record_resume`) with its
        outcome: ``granted``, ``timeout``, ``erased`` (an erasure of the session is in the
        store, applied or not), ``refused`` (none, or not active), ``error``.

        Raises:
            ResumeBarrierTimeout: the sequencer or the sink did not catch up, or
                the store did not answer, within ``timeout`` seconds.
            SessionErasedError: the session is being forgotten (:func:`claim_resume`).
        """
        started = time.monotonic()
        outcome = "error"
        try:
            grant = self._grant(session_id, started + timeout, fleets=fleets, turn_limit=turn_limit,
                                max_bytes=max_bytes)
            if grant is not None:
                outcome = "granted" if grant.status == SessionStatus.ACTIVE else "refused"
            else:
                outcome = "erased" if self._erased(session_id) else "refused"
            return grant
        except ResumeBarrierTimeout:
            outcome = "timeout"
            raise
        except SessionErasedError:
            outcome = "erased"
            raise
        finally:
            record_resume(outcome, started)

    def _erased(self, session_id: str) -> bool:
        """Whether the store holds an erasure of ``session_id`` (for the outcome label only: a
        store that does not answer now counts as no erasure)."""
        try:
            with self._store.reading() as reads:
                return reads.erasure_state(session_id) is not None
        except StoreError:
            return False

    def _grant(
        self,
        session_id: str,
        deadline: float,
        *,
        fleets: Collection[str] | None,
        turn_limit: int | None,
        max_bytes: int | None,
    ) -> ResumeGrant | None:
        key = self._settings.epoch_grant_key
        grant_key = key.get_secret_value() if key is not None else None

        def claim(key: str) -> Callable[[StoreWrites], ResumeGrant | None]:
            return lambda writes: claim_resume(writes, key, fleets=fleets, grant_key=grant_key,
                                               turn_limit=turn_limit, max_bytes=max_bytes)

        def stored(key: str) -> Callable[[StoreWrites], Mapping[str, Any] | None]:
            return lambda writes: writes.session(key, fleets=fleets, include_metadata=False)

        known = self._in_store(deadline, stored(session_id))
        if known is None or known["status"] == SessionStatus.ACTIVE:
            self._catch_up(session_id, deadline)
        granted = self._in_store(deadline, claim(session_id))
        bare = bare_id(session_id) if granted is None and known is None else None
        if bare is not None:
            # Not under its key: a session from before per-fleet keys, under its bare id, may be it.
            legacy = self._in_store(deadline, stored(bare))
            if legacy is not None and grants_as(session_id, bare, legacy["fleet"]):
                if legacy["status"] == SessionStatus.ACTIVE:
                    self._catch_up(bare, deadline)
                granted = self._in_store(deadline, claim(bare))
        return granted

    def wait(self, session_id: str, timeout: float) -> tuple[int, SessionPosition] | None:
        """Pass the barrier for ``session_id``, claim its next epoch, and return
        ``(new epoch, stored position)``; None if the store does not know the session.

        :meth:`grant` does the same and also returns the stored turns and the signed
        epoch grant; this issues none, so with fleet keys the sequencer refuses the new
        epoch's events: use :meth:`grant` there.

        Raises:
            ResumeBarrierTimeout: the sequencer or the sink did not catch up, or
                the store did not answer, within ``timeout`` seconds.
            SessionErasedError: the session is being forgotten (nothing claimed).
        """
        deadline = time.monotonic() + timeout
        self._catch_up(session_id, deadline)
        return self._in_store(deadline, lambda writes: _claim_epoch(writes, session_id))

    def _catch_up(self, session_id: str, deadline: float) -> None:
        """Steps 1 to 4 of the module docstring: until the store holds everything
        acknowledged for ``session_id``'s partition before this call."""
        topics = self._settings.topics
        partition = partition_for(session_id, self._settings.partitions)
        group = self._settings.sequencer_group
        try:
            events_end = self._retrying(
                deadline, lambda: self._end_offset(topics.events, partition, deadline),
                "timed out reading the events end offset (the broker kept failing)",
            )
            committed = self._retrying(
                deadline,
                lambda: _at_least(self._committed(group, topics.events, partition, deadline), events_end),
                f"timed out waiting for the sequencer ({group}) to consume {topics.events}[{partition}] "
                f"up to offset {events_end}",
            )
            transcript_end = self._retrying(
                deadline, lambda: self._record_end(topics.transcript, partition, deadline),
                "timed out reading the transcript end offset (the broker kept failing)",
            )
        except BrokerError as e:
            raise ResumeBarrierTimeout(f"resume barrier for {session_id}: broker error: {e}") from e
        stored = self._retrying(
            deadline,
            lambda: _at_least(self._sink_offset(topics.transcript, partition), transcript_end),
            f"timed out waiting for the sink ({self._settings.sink_group}) to store {topics.transcript}[{partition}] "
            f"up to offset {transcript_end}",
        )
        logger.info(
            "resume barrier for %s passed: %s[%d] ends at %d, the sequencer committed %d; "
            "%s[%d] records end at %d, the sink stored %d",
            session_id, topics.events, partition, events_end, committed,
            topics.transcript, partition, transcript_end, stored,
        )

    def _end_offset(self, topic: str, partition: int, deadline: float) -> int:
        """The partition's end offset, or -1 while the broker is unavailable (the barrier polls on)."""
        return _or_unavailable(lambda: self._offsets.end_offsets(topic, [partition], deadline=deadline)[partition])

    def _record_end(self, topic: str, partition: int, deadline: float) -> int:
        """The offset after the partition's last committed record (the sink's offset when it
        stored everything: the sequencer's transactions end in markers, past the last record),
        or -1 while the broker is unavailable (the barrier polls on)."""
        return _or_unavailable(lambda: self._offsets.record_ends(topic, [partition], deadline=deadline)[partition])

    def _committed(self, group_id: str, topic: str, partition: int, deadline: float) -> int:
        """``group_id``'s committed offset (0 when none), or -1 while the broker is unavailable."""
        return _or_unavailable(
            lambda: self._offsets.committed(group_id, topic, [partition], deadline=deadline)[partition] or 0
        )

    def close(self) -> None:
        """Drop the offsets lookup client (a later resume makes a new one)."""
        self._offsets.close()

    def _in_store(self, deadline: float, work: Callable[[StoreWrites], _T]) -> _T:
        """``work`` in one store transaction, retried every ``POLL_INTERVAL_SECONDS`` while
        the store is away, up to ``deadline``.

        Raises:
            ResumeBarrierTimeout: the store did not answer by ``deadline``.
        """

        def attempt() -> _T:
            with self._store.writing() as writes:
                return work(writes)

        def timed_out(state: RetryCallState) -> _T:
            error = state.outcome.exception() if state.outcome else None
            raise ResumeBarrierTimeout(f"resume barrier: the store did not answer: {error}") from error

        retrying = Retrying(
            retry=retry_if_exception_type(StoreUnavailableError),
            wait=wait_fixed(POLL_INTERVAL_SECONDS),
            stop=lambda _: time.monotonic() >= deadline,
            before_sleep=_log_store_retry,
            retry_error_callback=timed_out,
        )
        return retrying(attempt)

    def _sink_offset(self, topic: str, partition: int) -> int:
        try:
            with self._store.reading() as reads:
                stored = reads.stored_offsets(self._settings.sink_group, [(topic, partition)])
        except StoreUnavailableError as e:
            logger.warning("resume barrier: store unavailable, polling on: %s", e)
            return -1
        return stored.get((topic, partition), 0)

    @staticmethod
    def _retrying(deadline: float, read: Callable[[], int], failure: str) -> int:
        """``read()`` until it gives an offset (it gives -1 for "not yet"); ``failure`` says
        what timed out."""
        return _poll(read, lambda value: value < 0, deadline, failure)


def _or_unavailable(read: Callable[[], int]) -> int:
    """``read()``, or -1 on a retriable broker error (the barrier polls on).

    Raises:
        BrokerError: a non-retriable one.
    """
    try:
        return read()
    except BrokerError as e:
        if not e.retriable:
            raise
        logger.info("resume barrier: broker not ready (%s); polling on", e)
        return -1


def _at_least(value: int, floor: int) -> int:
    """``value`` once it reached ``floor``, else -1 (polled again)."""
    return value if value >= floor else -1


def _log_store_retry(state: RetryCallState) -> None:
    if state.attempt_number == 1:  # then every POLL_INTERVAL_SECONDS, quietly, up to the deadline
        error = state.outcome.exception() if state.outcome else None
        logger.warning("resume barrier: store unavailable, retrying until the deadline: %s", error)


def _poll(probe: Callable[[], _T], again: Callable[[_T], bool], deadline: float, failure: str) -> _T:
    """``probe()`` until ``again(result)`` is false, first every 5 ms, then less often, up to
    every ``POLL_INTERVAL_SECONDS``: a caught-up pipeline passes in milliseconds.

    Raises:
        ResumeBarrierTimeout: ``deadline`` (monotonic) passed first; ``failure`` says what for.
    """

    def timed_out(_: RetryCallState) -> _T:
        raise ResumeBarrierTimeout(f"resume barrier: {failure}")

    retrying = Retrying(
        retry=retry_if_result(again),
        wait=wait_exponential(multiplier=FIRST_POLL_SECONDS, max=POLL_INTERVAL_SECONDS),
        stop=lambda _: time.monotonic() >= deadline,
        retry_error_callback=timed_out,
    )
    return retrying(probe)


class StoreResumeSource:
    """A :class:`~turnlog.producers.grant.ResumeSource` that runs the :class:`ResumeBarrier` in
    this process, over ``store`` (default: opened at ``settings.database_url`` at the first
    grant) and the broker of ``settings``: for a host that holds the store (the demo, a
    single-host setup, tests)::

        SessionRecorder(settings, resume_source=StoreResumeSource(settings))

    Its grants are scoped to no fleet and carry a signed epoch grant when
    ``settings.epoch_grant_key`` is set (the sequencer admits a resumed epoch only with one
    when fleet keys are on). Agents that should not hold database credentials resume through
    the API instead (``TURNLOG_API_URL``).
    """

    def __init__(self, settings: TurnlogSettings, store: SqlStore | None = None) -> None:
        self._settings = settings
        self._store = store
        self._owns_store = store is None
        self._barrier: ResumeBarrier | None = None
        self._lock = threading.Lock()

    async def grant(self, session_id: str, timeout: float) -> ResumeGrant | None:
        """:meth:`ResumeBarrier.grant` in a worker thread: the same answers and exceptions."""
        return await asyncio.to_thread(self._grant, session_id, timeout)

    def _grant(self, session_id: str, timeout: float) -> ResumeGrant | None:
        with self._lock:  # one barrier (and store) for every resume of the recorder
            if self._barrier is None:
                if self._store is None:
                    self._store = open_store(self._settings.database_url)
                self._barrier = ResumeBarrier(self._settings, self._store)
            barrier = self._barrier
        return barrier.grant(session_id, timeout)

    def close(self) -> None:
        """Close the barrier's offsets client, and the store if this source opened it."""
        with self._lock:
            if self._barrier is not None:
                self._barrier.close()
                self._barrier = None
            if self._owns_store and self._store is not None:
                self._store.close()
                self._store = None


def resume_source_for(settings: TurnlogSettings) -> ResumeSource:
    """The resume source of a composition root that holds the store: turnlog's API when
    ``settings.api_url`` is set (as the recorder's default), else :class:`StoreResumeSource`
    over ``settings.database_url``."""
    if settings.api_url:
        return ApiResumeSource(settings.api_url, settings.api_token)
    return StoreResumeSource(settings)
