"""The spool drainer: one thread that owns the recorder's spool file and its
idempotent Kafka producer.

Order of work for each event (``submit`` from the agent's event loop):

1. queued for the drainer thread; the recorder counts its bytes against
   ``spool_max_bytes`` at once (:class:`~turnlog.producers.exceptions.SpoolFullError`
   when over);
2. committed to the spool with the other queued events, one fsync for all
   (group commit); the ticket's ``spooled`` future resolves;
3. produced to Kafka in spool order (a window of ``MAX_IN_FLIGHT`` records;
   idempotent producer, ``acks=all``, so per-partition order holds);
4. on the broker's acknowledgement, the ticket's ``acked`` future resolves and
   the row is deleted from the spool.

Erasure (docs/design.md, "Encryption and erasure"): :meth:`SpoolDrainer.forget`
takes sessions named by the erasure ledger (``producers/erasure_watch.py``):
from then on :meth:`~SpoolDrainer.submit` refuses their events
(:class:`~turnlog.producers.exceptions.SessionErasedError`), and the thread
deletes every row of them still held (``SpoolFile.drop_sessions``; counted in
``turnlog_erased_records_skipped_total{component="spool"}``) before it produces
anything more. Rows adopted from a dead recorder's spool are not produced
until the erasure check for their sessions (``erasure_check``) has resolved,
so a session forgotten while its recorder was dead is never delivered.

A failed delivery (the broker away longer than ``delivery.timeout.ms``, or any
other error) never gives an event up: the drainer lets the rest of the window
settle, waits (exponential backoff, capped), and produces everything still in
the spool again, in order. Events the broker had stored after all come back as
duplicates, which the sequencer drops by ``(session_id, seq)``. A fatal
producer error (librdkafka's idempotence state lost) replaces the producer.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_fixed

from turnlog.faults import fault_point
from turnlog.kafka import RecordRefusedError, produce, producer_from_config
from turnlog.metrics import (
    ERASED_RECORDS_SKIPPED,
    RECORDER_DEGRADED,
    SPOOL_BYTES,
    SPOOL_COMMIT_SECONDS,
    SPOOL_DRAINED,
    SPOOL_EVENTS,
    SPOOL_OLDEST_SECONDS,
    SPOOL_QUARANTINED,
)
from turnlog.producers.exceptions import RecorderError, SessionErasedError, SpoolError, SpoolFullError
from turnlog.producers.spool import SpooledEvent, SpoolFile, SpoolRow, held_by_other_spools
from turnlog.signing import FLEET_HEADER

__all__ = ["SpoolDrainer", "Ticket", "MAX_IN_FLIGHT", "MAX_REMEMBERED_ERASURES"]

logger = logging.getLogger(__name__)
#: Records produced and not yet acknowledged, at most: below the sequencer's default reorder
#: buffer (1024 per session), so a failed record re-sent after the rest of its window never
#: overflows it; and well under librdkafka's queue limit.
MAX_IN_FLIGHT = 500
#: Waits between re-delivery rounds after a failure (seconds): doubling from the first, capped.
RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS = 0.5, 15.0
_IDLE_WAIT_SECONDS = 0.1
_BUSY_POLL_SECONDS = 0.002
_STATS_EVERY_SECONDS = 1.0
#: Forgotten sessions whose new events :meth:`SpoolDrainer.submit` refuses, at most (the newest kept;
#: ~100 bytes each). Past it the oldest is let go: its RecordedSession refuses on its own by then.
MAX_REMEMBERED_ERASURES = 10_000
#: Answers whether the erasure ledger names any of these sessions: resolves once it was read for them.
ErasureCheck = Callable[[Collection[str]], "concurrent.futures.Future[None]"]


@dataclass(slots=True)
class Ticket:
    """One submitted event's progress: ``spooled`` resolves once it is fsynced in
    the spool, ``acked`` once the broker acknowledged it (both ``None`` results;
    ``spooled`` fails with :class:`~turnlog.producers.exceptions.SpoolError`)."""

    spooled: concurrent.futures.Future[None] = field(default_factory=lambda: _running_future())
    acked: concurrent.futures.Future[None] = field(default_factory=lambda: _running_future())


def _running_future() -> concurrent.futures.Future[None]:
    """A future in the RUNNING state: ``cancel()`` is refused, so an awaiting task that
    is cancelled (``asyncio.wrap_future`` passes cancellation on) cannot cancel it
    under the drainer's feet."""
    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    future.set_running_or_notify_cancel()
    return future


def _log_unexpected_error(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    logger.error("spool drainer: unexpected error; delivering again in %.1f s", RETRY_FIRST_SECONDS, exc_info=error)


def _resolve_once(
    future: concurrent.futures.Future[Any], result: Any = None, error: BaseException | None = None
) -> None:
    """Give ``future`` its result, or ``error``, unless it has one already (a cancelled or
    failed waiter)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


@dataclass(slots=True)
class _Backlog:
    """What the spool holds, kept in memory for the size limit, metrics and resume."""

    events: int = 0
    bytes: int = 0
    per_session: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: the fleets the held events of each session claim (their provenance header; none: unknown)
    fleets: dict[str, set[str]] = field(default_factory=dict)

    def add(self, event: SpooledEvent) -> None:
        self.events += 1
        self.bytes += len(event.value)
        self.per_session[event.session_id] += 1
        fleet = next((bytes(v).decode("utf-8", "replace") for n, v in event.headers if n == FLEET_HEADER), None)
        if fleet is not None:
            self.fleets.setdefault(event.session_id, set()).add(fleet)

    def remove(self, session_id: str, size: int) -> None:
        self.events -= 1
        self.bytes -= size
        left = self.per_session[session_id] - 1
        if left > 0:
            self.per_session[session_id] = left
        else:
            self.per_session.pop(session_id, None)
            self.fleets.pop(session_id, None)


class SpoolDrainer:
    """The spool file plus the thread that delivers it. No I/O in the constructor;
    :meth:`start` opens the spool, adopts orphaned spools in its folder and
    starts the thread. The caller's ``producer_config`` is copied, never mutated.
    """

    def __init__(
        self, folder: Path, producer_config: Mapping[str, Any], *, max_bytes: int,
        erasure_check: ErasureCheck | None = None,
    ) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self._config = dict(producer_config)
        self._spool: SpoolFile | None = None
        self._thread: threading.Thread | None = None
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._backlog = _Backlog()
        self._degraded = False
        self._erasure_check = erasure_check
        self._erased: OrderedDict[str, None] = OrderedDict()  # under _lock; bounded
        # thread-owned state
        self._producer: Producer | None = None
        self._tickets: dict[int, Ticket] = {}
        self._in_flight: dict[int, tuple[str, int]] = {}  # row id -> (session, value bytes)
        self._acked: list[int] = []
        self._cursor = 0  # the next row id to produce
        self._last_id = 0
        self._failed = False
        self._fatal = False
        self._failures = 0
        self._retry_at: float | None = None
        self._stopping = False
        self._closed = False
        self._pending_appends: list[tuple[list[SpooledEvent], list[Ticket]]] = []  # a failed commit, retried first
        self._write_retry_at = 0.0
        self._holds: list[tuple[concurrent.futures.Future[None], int]] = []  # (erasure check, first row held)

    @property
    def path(self) -> Path | None:
        """The spool file (None before :meth:`start`)."""
        return self._spool.path if self._spool is not None else None

    # -- the caller's side (any thread) ----------------------------------------
    def start(self) -> None:
        """Open the spool, adopt orphaned spools of this folder, start delivering.

        Raises:
            SpoolError: the folder or the file cannot be used.
        """
        if self._thread is not None:
            return
        if self._closed:
            raise RecorderError("this recorder was closed; make a new SessionRecorder")
        self._spool = SpoolFile(self.folder)
        self._producer = self._new_producer()
        self._spool.adopt_orphans(self._take_in)
        self._thread = threading.Thread(target=self._run, name="turnlog-spool-drainer", daemon=True)
        self._thread.start()

    def submit(self, events: Sequence[SpooledEvent]) -> list[Ticket]:
        """Queue ``events`` for the spool and delivery, in order.

        Raises:
            SpoolFullError: the spool would exceed ``max_bytes``; nothing was queued.
            RuntimeError: :meth:`start` was not called.
        """
        if self._closed:
            raise RecorderError("the recorder is closed; nothing more can be recorded")
        if self._thread is None:
            raise RuntimeError("SpoolDrainer.start() was not called")
        size = sum(len(e.value) for e in events)
        with self._lock:
            if self._closed:
                raise RecorderError("the recorder is closed; nothing more can be recorded")
            for e in events:
                if e.session_id in self._erased:
                    raise SessionErasedError(e.session_id)
            if self._backlog.bytes + size > self.max_bytes:
                raise SpoolFullError(
                    f"the spool {self.path} holds {self._backlog.bytes} bytes; {size} more would pass the limit "
                    f"of {self.max_bytes} bytes (TURNLOG_SPOOL_MAX_BYTES). It drains as the broker acknowledges."
                )
            for e in events:
                self._backlog.add(e)
            tickets = [Ticket() for _ in events]
            self._commands.put(("append", (list(events), tickets)))  # under the lock: never after the stop
        return tickets

    def adopt_orphans(self) -> concurrent.futures.Future[int]:
        """Adopt spools orphaned since :meth:`start` (on the drainer thread); resolves with the count of events."""
        if self._closed:
            raise RecorderError("the recorder is closed")
        if self._thread is None:
            raise RuntimeError("SpoolDrainer.start() was not called")
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RecorderError("the recorder is closed")
            self._commands.put(("adopt", done))
        return done

    def forget(self, session_ids: Collection[str]) -> None:
        """The erasure ledger names ``session_ids``: refuse their events from now on, and drop
        every row of them the spool holds before anything more is produced (any thread)."""
        if not session_ids:
            return
        with self._lock:
            for session_id in session_ids:
                self._erased[session_id] = None
                self._erased.move_to_end(session_id)
            while len(self._erased) > MAX_REMEMBERED_ERASURES:
                self._erased.popitem(last=False)
            if not self._closed:
                self._commands.put(("forget", frozenset(session_ids)))

    def fleets_held(self, session_id: str) -> frozenset[str]:
        """The fleets the spool's unacknowledged events of ``session_id`` claim (empty: none held, or
        none claims a fleet) (any thread)."""
        with self._lock:
            return frozenset(self._backlog.fleets.get(session_id, ()))

    def holds(self, session_id: str) -> bool:
        """True while the spool holds events of ``session_id`` not yet acknowledged (any thread)."""
        with self._lock:
            return session_id in self._backlog.per_session

    def pending(self, session_id: str | None = None) -> int:
        """Events held and not yet acknowledged (of ``session_id``, or all)."""
        with self._lock:
            return self._backlog.events if session_id is None else self._backlog.per_session.get(session_id, 0)

    def held_elsewhere(self, session_id: str) -> dict[Path, int]:
        """Events of ``session_id`` in the other spools of this folder (another live recorder's, or an
        orphan's not adopted yet): ``{spool path: events}`` (``spool.held_by_other_spools``). Blocking file I/O."""
        return held_by_other_spools(self.folder, session_id, own=self.path)

    @property
    def degraded(self) -> bool:
        """True from a slow acknowledgement (:meth:`note_slow_ack`) until the spool is empty again."""
        return self._degraded

    def note_slow_ack(self, waited: float) -> None:
        """The recorder waited ``waited`` seconds for an acknowledgement in vain: run degraded."""
        with self._lock:
            if self._degraded:
                return
            self._degraded = True
            held = self._backlog.events
            RECORDER_DEGRADED.set(1)
        logger.warning(
            "recorder degraded: the broker has not acknowledged within %.1f s; %d events are safe in the spool %s "
            "(a local disk: it does not survive the loss of this host) and are delivered when the broker is back",
            waited, held, self.path,
        )

    def close(self, timeout: float) -> int:
        """Deliver for up to ``timeout`` seconds, stop, and close the spool. Returns the
        events left undelivered; they stay in the spool file, which the next recorder
        started on this host (same ``spool_dir``) adopts."""
        if self._thread is None:
            return 0
        deadline = time.monotonic() + timeout
        while self.pending() > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._lock:
            self._closed = True  # submit() refuses from here: nothing is queued after the stop
            self._commands.put(("stop", None))
        self._thread.join()
        self._thread = None
        left = self.pending()
        if left:
            logger.warning("recorder closed with %d events undelivered; they stay in %s for the next recorder here",
                           left, self.path)
        return left

    # -- the drainer thread ----------------------------------------------------
    def _run(self) -> None:
        """The thread: :meth:`_deliver` until the stop, then :meth:`_finish`.

        An unexpected error (a disk error) must not end delivery for good: it is logged
        and :meth:`_deliver` starts again after ``RETRY_FIRST_SECONDS``, without limit;
        the spool and the delivery state carry over. Once :meth:`close` asked for the
        stop, an error ends the thread at once: what could not be spooled is failed in
        :meth:`_finish`.
        """
        retrying = Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, Exception) and not self._stopping),
            wait=wait_fixed(RETRY_FIRST_SECONDS),
            before_sleep=_log_unexpected_error,
            reraise=True,
        )
        try:
            retrying(self._deliver)
        except Exception:
            logger.exception("spool drainer: unexpected error while stopping")
        self._finish()

    def _deliver(self) -> None:
        """Spool what is submitted, adopt orphans, produce, until the stop (then it returns)."""
        assert self._spool is not None
        stats_at = 0.0
        while True:
            now = time.monotonic()
            if now - stats_at >= _STATS_EVERY_SECONDS:
                stats_at = now
                try:
                    self._publish_stats()
                except SpoolError as e:  # metrics must never stop delivery
                    logger.warning("spool metrics not updated: %s", e)
            appends, adopt_waiters, forgotten = self._next_commands()
            try:
                self._write(appends)  # on the stop too: what was queued before it is spooled
                if forgotten:  # after the appends queued before it: they are dropped too
                    self._drop_sessions(forgotten)
                for waiter in adopt_waiters:
                    self._adopt_now(waiter)
            except Exception:
                for waiter in adopt_waiters:  # those adopted already are settled: this is a no-op for them
                    _resolve_once(waiter, error=SpoolError("adopting orphaned spools failed; see the recorder's log"))
                raise
            if self._stopping:
                return
            assert self._producer is not None
            self._producer.poll(0)
            self._produce_more()

    def _next_commands(
        self,
    ) -> tuple[list[tuple[list[SpooledEvent], list[Ticket]]], list[concurrent.futures.Future[int]], set[str]]:
        appends: list[tuple[list[SpooledEvent], list[Ticket]]] = []
        adopt_waiters: list[concurrent.futures.Future[int]] = []
        forgotten: set[str] = set()
        # while failed, the retry round waits; rows held for an erasure check wait for it
        to_send = self._cursor <= min(self._last_id, self._hold_limit() - 1) and not self._failed
        busy = bool(self._in_flight or self._acked or to_send)
        try:
            if busy:
                # Serve delivery reports while waiting for new work.
                assert self._producer is not None
                self._producer.poll(_BUSY_POLL_SECONDS)
                command = self._commands.get_nowait()
            else:
                command = self._commands.get(timeout=_IDLE_WAIT_SECONDS)
            while True:
                kind, payload = command
                if kind == "append":
                    appends.append(payload)
                elif kind == "adopt":
                    adopt_waiters.append(payload)
                elif kind == "forget":
                    forgotten.update(payload)
                else:
                    self._stopping = True
                    break  # submit() refuses after the stop: nothing can follow it
                command = self._commands.get_nowait()
        except queue.Empty:
            pass
        return appends, adopt_waiters, forgotten

    def _write(self, appends: list[tuple[list[SpooledEvent], list[Ticket]]]) -> None:
        """Commit the queued appends (after any whose commit failed before) in one fsync.

        A failed commit (a full disk) is retried, in order, with backoff: each event
        already has its seq, so failing it would leave a gap the session never fills.
        """
        assert self._spool is not None
        appends = self._pending_appends + appends
        self._pending_appends = []
        acked, self._acked = self._acked, []
        if appends and time.monotonic() < self._write_retry_at and not self._stopping:
            self._pending_appends = appends
            appends = []
        if not appends:
            if acked:
                try:
                    self._spool.delete(acked)
                except SpoolError:
                    self._acked.extend(acked)
                    raise
            return
        events = [e for batch, _ in appends for e in batch]
        tickets = [t for _, batch in appends for t in batch]
        began = time.perf_counter()
        try:
            ids = self._spool.append(events, delete_ids=acked)
        except SpoolError as e:
            self._acked.extend(acked)
            self._pending_appends = appends
            self._write_retry_at = time.monotonic() + RETRY_FIRST_SECONDS
            logger.error("spool: cannot commit %d events (%s); retrying, in order", len(events), e)
            if self._stopping:
                raise
            return
        SPOOL_COMMIT_SECONDS.observe(time.perf_counter() - began)
        self._last_id = ids[-1]
        self._cursor = min(self._cursor, ids[0])
        for row_id, ticket in zip(ids, tickets, strict=True):
            self._tickets[row_id] = ticket
        for ticket in tickets:
            _resolve_once(ticket.spooled)

    def _adopt_now(self, waiter: concurrent.futures.Future[int]) -> None:
        assert self._spool is not None
        counted: list[int] = []

        def take_in(rows: list[SpoolRow]) -> None:
            self._take_in(rows)
            counted.append(len(rows))

        try:
            self._spool.adopt_orphans(take_in)
        finally:
            _resolve_once(waiter, sum(counted))

    def _take_in(self, rows: list[SpoolRow]) -> None:
        """Count adopted rows as held, and hold them (and all after them) back from delivery
        until the erasure ledger was read for their sessions."""
        if not rows:
            return
        with self._lock:
            for row in rows:
                self._backlog.add(row.event)
        if self._erasure_check is not None:
            self._holds.append((self._erasure_check({row.event.session_id for row in rows}), rows[0].id))
        self._last_id = max(self._last_id, rows[-1].id)
        self._cursor = min(self._cursor, rows[0].id)

    def _is_erased(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._erased

    def _hold_limit(self) -> float:
        """The first row id not to produce yet (inf: none held): the oldest row adopted whose
        erasure check has not resolved. A check that failed or was cancelled holds nothing."""
        if not self._holds:
            return float("inf")
        self._holds = [(check, first) for check, first in self._holds if not check.done()]
        return min((first for _, first in self._holds), default=float("inf"))

    def _drop_sessions(self, session_ids: set[str]) -> None:
        """Delete what the spool holds of forgotten sessions; fail their tickets with
        :class:`SessionErasedError`. Rows of them produced and not acknowledged yet may still
        wait in the producer's queue (the broker away): the producer is purged and replaced,
        and the rest of the spool is produced again, in order (duplicates the sequencer drops).
        What already reached the broker cannot be called back; every reader drops it by the ledger."""
        assert self._spool is not None
        erased = {session_id: SessionErasedError(session_id) for session_id in session_ids}
        kept_appends = []
        for events, tickets in self._pending_appends:  # queued, never committed: refused here
            kept: tuple[list[SpooledEvent], list[Ticket]] = ([], [])
            for event, ticket in zip(events, tickets, strict=True):
                if event.session_id in erased:
                    with self._lock:
                        self._backlog.remove(event.session_id, len(event.value))
                    _resolve_once(ticket.spooled, error=erased[event.session_id])
                    _resolve_once(ticket.acked, error=erased[event.session_id])
                else:
                    kept[0].append(event)
                    kept[1].append(ticket)
            if kept[0]:
                kept_appends.append(kept)
        self._pending_appends = kept_appends
        rows, quarantined = self._spool.drop_sessions(session_ids)
        acked = set(self._acked)
        skipped = quarantined
        in_flight = False
        with self._lock:
            for row_id, session_id, size in rows:
                if row_id in acked:
                    continue  # acknowledged: out of the backlog already, its delete is now a no-op
                in_flight |= self._in_flight.pop(row_id, None) is not None
                skipped += 1
                self._backlog.remove(session_id, size)
        for row_id, session_id, _ in rows:
            waiting = self._tickets.pop(row_id, None)
            if waiting is not None:
                _resolve_once(waiting.acked, error=erased[session_id])
        if skipped:
            ERASED_RECORDS_SKIPPED.labels(component="spool").inc(skipped)
        logger.warning("spool: %d sessions forgotten (%s); %d of their undelivered events dropped from %s",
                       len(session_ids), ", ".join(sorted(session_ids)[:5]), skipped, self.path)
        if in_flight:
            self._replace_producer("events of a forgotten session were waiting in the producer's queue")
        self._recovered_if_empty()

    def _produce_more(self) -> None:
        assert self._spool is not None and self._producer is not None
        if self._fatal and not self._failed:
            self._replace_producer("fatal producer error")
        if self._failed:
            if self._in_flight:
                return  # let the rest of the window settle first
            now = time.monotonic()
            # Not tenacity: the next round is scheduled, not slept for, so that this thread
            # goes on spooling, serving delivery reports and adopting spools meanwhile.
            if self._retry_at is None:
                self._failures += 1  # failed rounds, not records: one round may fail hundreds
                wait = min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2 ** min(self._failures - 1, 16))
                self._retry_at = now + wait
                logger.warning("spool: delivery failed; %d events held, next delivery round in %.1f s", self.pending(),
                               wait)
            if now < self._retry_at:
                return
            self._failed, self._retry_at = False, None
            if self._acked:
                self._spool.delete(self._acked)
                self._acked = []
            self._cursor = 0  # everything still held, from the oldest, in order
        limit = self._hold_limit()
        while self._cursor <= self._last_id and self._cursor < limit and len(self._in_flight) < MAX_IN_FLIGHT:
            rows = self._spool.rows_from(self._cursor, MAX_IN_FLIGHT - len(self._in_flight))
            if not rows:
                self._cursor = self._last_id + 1
                break
            for row in rows:
                if row.id >= limit:
                    self._cursor = row.id
                    return
                if self._is_erased(row.event.session_id):  # its forget command is on its way: never sent
                    self._cursor = row.id + 1
                    continue
                if not self._produce(row):
                    return
                self._cursor = row.id + 1

    def _produce(self, row: SpoolRow) -> bool:
        assert self._producer is not None
        event = row.event

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            self._on_delivery(row.id, err)

        try:
            signed = {"headers": list(event.headers)} if event.headers else {}
            produce(self._producer, event.topic, event.value, key=event.key, on_delivery=on_delivery, **signed)
        except BufferError:
            self._producer.poll(0.01)  # librdkafka's queue is full: serve reports, go on next round
            return False
        except RecordRefusedError as e:  # this record can never be produced (too large): set it aside
            self._quarantine(row, e)
            return True
        self._in_flight[row.id] = (event.session_id, len(event.value))
        fault_point("producer.after_produce")
        return True

    def _quarantine(self, row: SpoolRow, error: RecordRefusedError) -> None:
        """Move a record the client refuses for good out of the delivery order, so it
        cannot block the rest of the spool; it stays on disk (``quarantined`` table)."""
        assert self._spool is not None
        self._spool.quarantine(row.id)
        with self._lock:
            self._backlog.remove(row.event.session_id, len(row.event.value))
        SPOOL_QUARANTINED.inc()
        logger.error(
            "spool: event seq %d of session %s cannot be produced (%s); set aside in the quarantined table of %s",
            row.event.seq, row.event.session_id, error, self.path,
        )
        ticket = self._tickets.pop(row.id, None)
        if ticket is not None:
            _resolve_once(ticket.acked, error=SpoolError(f"the producer refused the event for good: {error}"))

    def _on_delivery(self, row_id: int, err: KafkaError | None) -> None:
        held = self._in_flight.pop(row_id, None)
        if held is None:
            return  # a report for a purged record
        if err is not None:
            if not self._failed:
                logger.warning("spool: delivery failed (%s); the event stays in the spool and is sent again", err.str())
            self._failed = True
            if err.fatal():
                self._fatal = True
            return
        self._failures = 0
        self._acked.append(row_id)
        with self._lock:
            self._backlog.remove(*held)
            empty = self._backlog.events == 0
        SPOOL_DRAINED.inc()
        ticket = self._tickets.pop(row_id, None)
        if ticket is not None:
            _resolve_once(ticket.acked)
        if empty:
            self._recovered_if_empty()

    def _recovered_if_empty(self) -> None:
        with self._lock:
            if not self._degraded or self._backlog.events:
                return
            self._degraded = False
            RECORDER_DEGRADED.set(0)
        logger.warning("recorder recovered: the broker acknowledged every spooled event")

    def _replace_producer(self, why: str) -> None:
        assert self._producer is not None
        logger.error("spool: %s; replacing the producer and sending the spool again", why)
        self._producer.purge(in_queue=True, in_flight=True)
        self._producer.poll(0)
        self._in_flight.clear()
        self._producer = self._new_producer()
        self._fatal = False
        self._failed = True

    def _new_producer(self) -> Producer:
        def on_error(err: KafkaError) -> None:
            if err.fatal():
                self._fatal = True
                logger.error("fatal producer error: %s", err.str())
            else:
                logger.info("producer: %s", err.str())

        return producer_from_config({"logger": logger, **self._config, "error_cb": on_error})

    def _publish_stats(self) -> None:
        assert self._spool is not None
        with self._lock:
            events, size = self._backlog.events, self._backlog.bytes
        SPOOL_EVENTS.set(events)
        SPOOL_BYTES.set(size)
        oldest = self._spool.oldest_spooled_at() if events else None
        SPOOL_OLDEST_SECONDS.set(0.0 if oldest is None else max(0.0, time.time() - oldest))

    def _finish(self) -> None:
        assert self._spool is not None and self._producer is not None
        self._producer.flush(1.0)  # reports for what is in flight (close() waited already)
        self._producer.poll(0)
        try:
            if self._acked:
                self._spool.delete(self._acked)
                self._acked = []
        finally:
            closed = RecorderError("the recorder closed before the broker acknowledged this event; it stays"
                                   " in the spool")
            for ticket in self._tickets.values():
                _resolve_once(ticket.acked, error=closed)
            for _, tickets in self._pending_appends:
                for ticket in tickets:
                    _resolve_once(ticket.spooled,
                            error=SpoolError("the recorder closed while the spool could not be written"))
                    _resolve_once(ticket.acked, error=closed)
            self._spool.close(remove_if_empty=True)
            self._publish_stats_closed()

    def _publish_stats_closed(self) -> None:
        SPOOL_EVENTS.set(0)
        SPOOL_BYTES.set(0)
        SPOOL_OLDEST_SECONDS.set(0)
