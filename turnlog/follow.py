"""Follow one session: its stored backlog, then the live tail, with no gap and no duplicate.

Two sources, one rule. The store (``session_events``, up to the session's
contiguous ``last_seq``) is the truth; the transcript topic is the fast path.
:class:`TranscriptHub` is the one Kafka consumer of a process (the API, or
``turnlog tail``): it reads every partition of ``<prefix>.transcript`` from its
end and fans each record out to the subscribers of its session.

:func:`follow_session` yields events in strict ``seq`` order, each once:

1. the backlog: every stored event after the resume point;
2. the live tail: an event with ``seq = last + 1`` is yielded at once, one at or
   below ``last`` is a duplicate and dropped;
3. a live event past a gap (``seq > last + 1``: it reached the topic before
   this subscriber registered, or the hub dropped it), a full subscriber queue,
   or ``poll_seconds`` without news all send it back to the store, which the
   sink fills from the same topic.

A subscriber's queue is bounded in events and in bytes. A follower that
cannot keep up (its consumer, an HTTP client, reads slower than the session
writes) either falls back to the store as above, or, with
``cut_off_when_behind``, is ended with :class:`FollowerFellBehind` naming the
last event it yielded, so its client resumes exactly after it (the API's
``Last-Event-ID``) instead of the server holding what it cannot send.

So correctness never depends on the hub: without it (broker down) a follower
still gets every event, ``poll_seconds`` late at most. The stream ends after
the session's ``session.ended`` event, or as soon as the store says nothing
can follow the resume point (resumed at or past the end; abandoned).

A session being forgotten (docs/design.md, "Encryption and erasure") ends its
followers with :class:`SessionErased`, whichever source tells first: the
store's ``erasures`` row (every store read checks it), the erasure ledger
``<prefix>.erasures`` (the hub follows it beside the transcript), or the
hub's own look at the store for the sessions it serves (every
``erasure_check_seconds``). From then on the hub hands out nothing of it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from confluent_kafka import OFFSET_END, TopicPartition
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_fixed

from turnlog import kafka
from turnlog.crypto.config import event_opener
from turnlog.crypto.envelope import is_sealed, open_sealed
from turnlog.crypto.ledger_signatures import ledger_verifier
from turnlog.metrics import ERASED_RECORDS_SKIPPED, LIVE_RECORDS_SKIPPED
from turnlog.schemas import EventValidationError, decode_event, encode_event
from turnlog.schemas.erasure import Erasure
from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import SqlStore
from turnlog.sinks.reads import EventPage, StoredEvent

__all__ = ["TranscriptHub", "Subscription", "follow_session", "store_fetch", "FollowerFellBehind", "SessionErased",
           "SESSION_ENDED", "SUBSCRIPTION_QUEUE_SIZE", "SUBSCRIPTION_QUEUE_BYTES", "ERASED_IDS_KEPT"]

logger = logging.getLogger(__name__)

SESSION_ENDED = "session.ended"
#: Live events one subscriber may hold before it falls back to the store (or is cut off).
SUBSCRIPTION_QUEUE_SIZE = 1024
#: Bytes of live events (their JSON) one subscriber may hold, by default (the API: ``api_stream_queue_bytes``).
SUBSCRIPTION_QUEUE_BYTES = 1024 * 1024

#: ``fetch(session_id, after_seq)`` -> stored events with seq > after_seq, in order (a bounded page).
Fetch = Callable[[str, int], Awaitable[EventPage]]
#: Seconds between attempts to find the transcript topic's partitions.
TOPIC_RETRY_SECONDS = 5.0
#: Forgotten session ids a hub remembers (the most recent; ~200 bytes each). One it forgot is
#: learnt again from the store by its followers' reads and by the hub's look at the store.
ERASED_IDS_KEPT = 10_000
#: Session ids asked about in one query of the hub's look at the store.
ERASURE_CHECK_BATCH = 500


def _log_topic_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    if isinstance(error, kafka.UnknownTopicError):
        logger.warning("transcript hub: the transcript topic does not exist (yet); followers read the store only: %s",
                       error)
    else:
        logger.warning("transcript hub: cannot read the transcript topic's partitions yet: %s", error)


class SessionErased(Exception):
    """The session is forgotten, or being forgotten (it has an erasure): its follower ends
    and nothing more of it is handed out."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id} is forgotten")
        self.session_id = session_id


class FollowerFellBehind(Exception):
    """A follower's live queue overflowed while it was cut off on falling behind.
    ``last_seq``: the last seq it yielded (its resume point; the start point if none)."""

    def __init__(self, session_id: str, last_seq: int) -> None:
        super().__init__(f"the follower of {session_id} fell behind after seq {last_seq}")
        self.session_id = session_id
        self.last_seq = last_seq


def store_fetch(store: SqlStore, *, max_bytes: int | None = None) -> Fetch:
    """A :data:`Fetch` over ``store`` (each read in a worker thread, on its own connection);
    a page holds about ``max_bytes`` of payload at most (None: only the row bound).

    Raises:
        SessionErased: the session has an erasure row (pending or done); nothing of it is read.
    """

    def read(session_id: str, after_seq: int) -> EventPage:
        with store.reading() as reads:
            if reads.forgotten_among([session_id]):
                raise SessionErased(session_id)
            return reads.events_after(session_id, after_seq, max_bytes=max_bytes)

    async def fetch(session_id: str, after_seq: int) -> EventPage:
        return await asyncio.to_thread(read, session_id, after_seq)

    return fetch


class Subscription:
    """The live events of one session for one follower: an asyncio queue bounded by
    ``maxsize`` events and ``max_bytes`` bytes of event JSON."""

    def __init__(
        self, session_id: str, maxsize: int = SUBSCRIPTION_QUEUE_SIZE, max_bytes: int = SUBSCRIPTION_QUEUE_BYTES
    ) -> None:
        self.session_id = session_id
        self.max_bytes = max_bytes
        # None: the wake-up of end_erased (queued after the queue was emptied, so it always fits).
        self._queue: asyncio.Queue[tuple[StoredEvent, int] | None] = asyncio.Queue(maxsize)
        self._bytes = 0
        self._overflowed = False
        self._erased = False

    @property
    def overflowed(self) -> bool:
        """Whether an event was dropped since the last :meth:`next` that reported it."""
        return self._overflowed

    @property
    def erased(self) -> bool:
        """Whether the hub learnt that the session is forgotten (then it holds and takes nothing)."""
        return self._erased

    def end_erased(self) -> None:
        """Called on the event loop by the hub: the session is forgotten. Drops every event held,
        takes none from now on, and wakes a waiting :meth:`next` (which returns None)."""
        if self._erased:
            return
        self._erased = True
        while not self._queue.empty():
            self._queue.get_nowait()
        self._bytes = 0
        self._queue.put_nowait(None)

    def offer(self, event: StoredEvent, size: int | None = None) -> None:
        """Called on the event loop by the hub; ``size``: the event's bytes (default: its
        payload's UTF-8 length). An event past either bound is dropped and marks an
        overflow (the follower reads the store instead); never blocks."""
        if self._erased:
            return
        if size is None:
            size = len(event.payload.encode("utf-8"))
        if self._overflowed or self._bytes + size > self.max_bytes:
            self._overflowed = True
            return
        try:
            self._queue.put_nowait((event, size))
        except asyncio.QueueFull:
            self._overflowed = True
            return
        self._bytes += size

    async def next(self, timeout: float) -> StoredEvent | None:
        """The next live event, or None after ``timeout`` seconds, an overflow (read the store
        then) or once the session is forgotten (:attr:`erased`)."""
        if self._erased:
            return None
        if self._overflowed:
            while not self._queue.empty():
                self._queue.get_nowait()
            self._bytes = 0
            self._overflowed = False
            return None
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None
        if item is None or self._erased:
            return None
        event, size = item
        self._bytes -= size
        return event


class TranscriptHub:
    """One consumer of ``<prefix>.transcript`` per process, fanned out by session id.

    It joins no consumer group (it is assigned every partition at its end
    offset and commits nothing), so every API process sees every record and
    none steals partitions from another. Records are decoded only when their
    session has a subscriber.

    ``on_following`` (optional) is called once, in the hub's thread, when the
    consumer is assigned every partition of the topic (the API's readiness).

    A sealed record is opened with ``settings.keyring_file``'s keyring and
    handed out as its writer built it (the store's payloads have that shape too).

    A record it cannot decode, open or hand out is skipped, counted in
    ``turnlog_live_records_skipped_total`` and logged by topic, partition and
    offset (never its content); it never stops the hub's thread. Followers
    still get the event from the store if the sink stored it.

    Forgotten sessions (module docstring): the hub also follows every
    partition of ``<prefix>.erasures`` from its end (a missing ledger topic is
    logged once and left out), and, given a ``store``, a second thread asks
    it every ``erasure_check_seconds`` (default ``api_poll_seconds``) which of
    the sessions it serves have an erasure row, in one query per
    ``ERASURE_CHECK_BATCH`` ids (a store outage is logged and tried again). A
    forgotten session's subscribers are ended (:meth:`Subscription.end_erased`)
    and its records are dropped unread from then on, counted in
    ``turnlog_erased_records_skipped_total{component="live"}``. The hub
    remembers the last ``ERASED_IDS_KEPT`` forgotten ids.

    Raises:
        KeyMaterialError: (constructor) the keyring is set and cannot be used.
    """

    def __init__(
        self,
        settings: TurnlogSettings,
        *,
        store: SqlStore | None = None,
        erasure_check_seconds: float | None = None,
        consumer_config: dict[str, Any] | None = None,
        on_following: Callable[[], object] | None = None,
    ) -> None:
        self.settings = settings
        self._store = store
        self._ledger = ledger_verifier(settings)  # ConfigurationError: a malformed issuer key
        self._erasure_check_seconds = (
            settings.api_poll_seconds if erasure_check_seconds is None else erasure_check_seconds
        )
        self._on_following = on_following
        self._group_id = f"{settings.topic_prefix}-live-{uuid.uuid4().hex[:8]}"  # required by the client; never joined
        self._config = {"enable.auto.offset.store": False, **(consumer_config or {})}
        self._subscribers: dict[str, set[Subscription]] = {}
        self._erased: OrderedDict[str, None] = OrderedDict()  # forgotten ids, oldest first, bounded
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opener = event_opener(settings)

    def start(self) -> None:
        """Start consuming in a daemon thread (and, with a store, the erasure check in another);
        call from the event loop that subscribers use."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="transcript-hub", daemon=True)
        self._thread.start()
        if self._store is not None:
            self._watcher = threading.Thread(target=self._watch_erasures, name="transcript-hub-erasures",
                                             daemon=True)
            self._watcher.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        for thread in (self._thread, self._watcher):
            if thread is not None:
                thread.join(timeout)

    def subscribe(self, session_id: str, *, max_bytes: int = SUBSCRIPTION_QUEUE_BYTES) -> Subscription:
        """A new subscription to ``session_id``'s live records (call on the event loop); one of a
        session the hub knows forgotten is ended at once."""
        subscription = Subscription(session_id, max_bytes=max_bytes)
        with self._lock:
            self._subscribers.setdefault(session_id, set()).add(subscription)
            erased = session_id in self._erased
        if erased:
            subscription.end_erased()
        return subscription

    def is_erased(self, session_id: str) -> bool:
        """Whether the hub knows ``session_id`` forgotten (among the last ``ERASED_IDS_KEPT``)."""
        with self._lock:
            return session_id in self._erased

    def mark_erased(self, session_id: str) -> None:
        """``session_id`` is forgotten (thread-safe): end its subscribers, hand out nothing more of it."""
        with self._lock:
            known = session_id in self._erased
            self._erased[session_id] = None
            self._erased.move_to_end(session_id)
            while len(self._erased) > ERASED_IDS_KEPT:
                self._erased.popitem(last=False)
            subscribers = list(self._subscribers.get(session_id, ()))
        if not known:
            logger.info("transcript hub: session %s is forgotten; its %d live followers end", session_id,
                        len(subscribers))
        if subscribers and self._loop is not None:
            for subscription in subscribers:
                self._loop.call_soon_threadsafe(subscription.end_erased)

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            held = self._subscribers.get(subscription.session_id)
            if held is not None:
                held.discard(subscription)
                if not held:
                    del self._subscribers[subscription.session_id]

    @property
    def subscriber_count(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._subscribers.values())

    def _run(self) -> None:
        topic = self.settings.topics.transcript
        ledger = self.settings.topics.erasures
        consumer = kafka.consumer(self.settings, group_id=self._group_id, **self._config)
        offsets = kafka.OffsetReader(self.settings)
        try:
            partitions = self._partitions(offsets, topic)
            if partitions is None:
                return  # stopped before the topic was found
            try:
                ledger_partitions = offsets.partitions(ledger)
            except kafka.BrokerError as e:  # no ledger topic (yet): the store still tells of erasures
                logger.warning("transcript hub: cannot follow the erasure ledger %s (%s); forgotten sessions' "
                               "streams end when the store shows their erasure", ledger, type(e).__name__)
                ledger_partitions = []
            offsets.close()
            consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in partitions]
                            + [TopicPartition(ledger, p, OFFSET_END) for p in ledger_partitions])
            logger.info("transcript hub: following %d partitions of %s and %d of %s", len(partitions), topic,
                        len(ledger_partitions), ledger)
            if self._on_following is not None:
                self._on_following()
            while not self._stopping.is_set():
                record = consumer.poll(0.5)
                if record is None or record.error() is not None:
                    continue
                if record.topic() == ledger:
                    self._handle_erasure(record)
                else:
                    self._handle(record)
        finally:
            consumer.close()

    def _handle_erasure(self, record: Any) -> None:
        """One erasure ledger record: its session is forgotten. One that does not decode names
        nothing to forget: skipped and counted like an invalid transcript record."""
        try:
            erasure = self._ledger.read(record.key(), record.value(), record.headers()).erasure
        except EventValidationError:
            LIVE_RECORDS_SKIPPED.labels(reason="invalid").inc()
            logger.warning("transcript hub: skipped the erasure record at %s[%s] offset %s (invalid or not "
                           "signed by an erasure issuer)", record.topic(), record.partition(), record.offset())
            return
        if self._store is not None and not self._of_its_fleet(erasure):
            return  # another fleet's session of that id: an erasure is bound to its fleet
        self.mark_erased(erasure.session_id)

    def _of_its_fleet(self, erasure: Erasure) -> bool:
        """Whether ``erasure`` names the fleet of the stored session of its id (True when the store
        holds none, or does not answer: a stream is closed rather than left open)."""
        assert self._store is not None
        try:
            with self._store.reading() as reads:
                session = reads.session(erasure.session_id, fleets=None, include_metadata=False)
        except Exception:  # noqa: BLE001 (an outage: the stream is closed, the reader may reconnect)
            return True
        return session is None or session["fleet"] in (None, erasure.fleet)

    def _watch_erasures(self) -> None:
        """Every ``erasure_check_seconds``: which sessions with subscribers have an erasure row."""
        assert self._store is not None
        while not self._stopping.wait(self._erasure_check_seconds):
            with self._lock:
                followed = [sid for sid in self._subscribers if sid not in self._erased]
            try:
                for start in range(0, len(followed), ERASURE_CHECK_BATCH):
                    with self._store.reading() as reads:
                        erased = reads.forgotten_among(followed[start:start + ERASURE_CHECK_BATCH])
                    for session_id in sorted(erased):
                        self.mark_erased(session_id)
            except Exception as error:  # noqa: BLE001 (an outage or a bug: logged, tried again next round)
                logger.warning("transcript hub: cannot check the store for erasures (%s); trying again in %g s",
                               type(error).__name__, self._erasure_check_seconds)

    def _partitions(self, offsets: kafka.OffsetReader, topic: str) -> list[int] | None:
        """``topic``'s partitions, looked up again every ``TOPIC_RETRY_SECONDS`` while the topic
        is missing or the broker fails (any :class:`~turnlog.kafka.BrokerError`); None once
        :meth:`stop` was called (it also ends the wait)."""

        def lookup() -> list[int] | None:
            return None if self._stopping.is_set() else offsets.partitions(topic)

        def pause(seconds: float) -> None:
            self._stopping.wait(seconds)  # a stop ends the wait

        retrying = Retrying(
            retry=retry_if_exception_type(kafka.BrokerError),
            wait=wait_fixed(TOPIC_RETRY_SECONDS),
            stop=lambda _: self._stopping.is_set(),
            sleep=pause,
            before_sleep=_log_topic_retry,
            retry_error_callback=lambda _: None,
        )
        return retrying(lookup)

    def _handle(self, record: Any) -> None:
        """Hand one consumed record (a ``confluent_kafka.Message``) to its session's
        subscribers; any failure skips this record only (see the class docstring)."""
        try:
            self._dispatch(record.key(), record.value())
        except Exception as error:  # noqa: BLE001 (one hostile or broken record never stops the hub)
            reason = "invalid" if isinstance(error, EventValidationError) else "error"
            LIVE_RECORDS_SKIPPED.labels(reason=reason).inc()
            # The error's class only: a message could quote the record's content.
            logger.warning("transcript hub: skipped the record at %s[%s] offset %s (%s)", record.topic(),
                           record.partition(), record.offset(), type(error).__name__)

    def _dispatch(self, key: bytes | None, value: bytes | None) -> None:
        """Raises whatever decoding raises (:meth:`_handle` skips the record)."""
        if key is None or value is None:
            return
        session_id = key.decode("utf-8", "replace")
        with self._lock:
            subscribers = list(self._subscribers.get(session_id, ()))
            erased = session_id in self._erased
        if not subscribers:
            return
        if erased:  # never handed out, never opened
            ERASED_RECORDS_SKIPPED.labels(component="live").inc()
            return
        event = decode_event(value)  # an invalid one: the sink dead-letters it; followers never see it
        if is_sealed(event):
            event = open_sealed(event, self._opener)
            value = encode_event(event)
        live = StoredEvent(event.seq, str(type(event).__struct_config__.tag), value.decode("utf-8"))
        assert self._loop is not None
        for subscription in subscribers:
            self._loop.call_soon_threadsafe(subscription.offer, live, len(value))


async def follow_session(
    fetch: Fetch,
    hub: TranscriptHub | None,
    session_id: str,
    after_seq: int = -1,
    *,
    poll_seconds: float = 1.0,
    queue_bytes: int = SUBSCRIPTION_QUEUE_BYTES,
    cut_off_when_behind: bool = False,
) -> AsyncIterator[StoredEvent]:
    """Every event of ``session_id`` with ``seq > after_seq``, each once, in seq order,
    until ``session.ended``, or at once if the store says nothing can follow
    ``after_seq`` (see the module docstring for the rule).

    ``queue_bytes`` bounds the live events held for this follower. When they
    overflow it, the follower reads the store again, or, with
    ``cut_off_when_behind``, raises :class:`FollowerFellBehind`.

    Raises:
        SessionErased: the session is forgotten (the hub or ``fetch`` says so); nothing more
            of it is yielded.
        FollowerFellBehind: as above.
    """
    subscription = hub.subscribe(session_id, max_bytes=queue_bytes) if hub is not None else None
    last = after_seq

    def check_erased() -> None:
        if subscription is not None and subscription.erased:
            raise SessionErased(session_id)

    try:
        while True:
            while True:  # the store: backlog, or a gap's fill
                check_erased()
                page = await fetch(session_id, last)
                for event in page.events:
                    check_erased()  # between the events of a page too: a client may read them slowly
                    yield event
                    last = event.seq
                    if event.type == SESSION_ENDED:
                        return
                if page.finished:  # resumed at or past the end, or abandoned: nothing will come
                    return
                if not page.events:
                    break
            yielded_live = False
            while True:  # the live tail, until it has a gap or goes quiet
                if subscription is None:
                    await asyncio.sleep(poll_seconds)
                    break
                # An overflow while this follower was in the live tail: its consumer did not keep up
                # with the session (one that happened while reading the store only sends it back there).
                if cut_off_when_behind and yielded_live and subscription.overflowed:
                    raise FollowerFellBehind(session_id, last)
                live = await subscription.next(poll_seconds)
                check_erased()
                if live is None or live.seq > last + 1:
                    break
                if live.seq <= last:
                    continue  # a duplicate (the sequencer re-emitted it, or the store gave it already)
                yield live
                yielded_live = True
                last = live.seq
                if live.type == SESSION_ENDED:
                    return
    finally:
        if subscription is not None and hub is not None:
            hub.unsubscribe(subscription)
