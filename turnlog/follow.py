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
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from confluent_kafka import OFFSET_END, TopicPartition
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_fixed

from turnlog import kafka
from turnlog.crypto.config import event_opener
from turnlog.crypto.envelope import is_sealed, open_sealed
from turnlog.metrics import LIVE_RECORDS_SKIPPED
from turnlog.schemas import EventValidationError, decode_event, encode_event
from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import SqlStore
from turnlog.sinks.reads import EventPage, StoredEvent, events_after

__all__ = ["TranscriptHub", "Subscription", "follow_session", "store_fetch", "FollowerFellBehind", "SESSION_ENDED",
           "SUBSCRIPTION_QUEUE_SIZE", "SUBSCRIPTION_QUEUE_BYTES"]

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


def _log_topic_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    if isinstance(error, kafka.UnknownTopicError):
        logger.warning("transcript hub: the transcript topic does not exist (yet); followers read the store only: %s",
                       error)
    else:
        logger.warning("transcript hub: cannot read the transcript topic's partitions yet: %s", error)


class FollowerFellBehind(Exception):
    """A follower's live queue overflowed while it was cut off on falling behind.
    ``last_seq``: the last seq it yielded (its resume point; the start point if none)."""

    def __init__(self, session_id: str, last_seq: int) -> None:
        super().__init__(f"the follower of {session_id} fell behind after seq {last_seq}")
        self.session_id = session_id
        self.last_seq = last_seq


def store_fetch(store: SqlStore, *, max_bytes: int | None = None) -> Fetch:
    """A :data:`Fetch` over ``store`` (each read in a worker thread, on its own connection);
    a page holds about ``max_bytes`` of payload at most (None: only the row bound)."""

    def read(session_id: str, after_seq: int) -> EventPage:
        with store.engine.connect() as conn:
            return events_after(conn, session_id, after_seq, max_bytes=max_bytes)

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
        self._queue: asyncio.Queue[tuple[StoredEvent, int]] = asyncio.Queue(maxsize)
        self._bytes = 0
        self._overflowed = False

    @property
    def overflowed(self) -> bool:
        """Whether an event was dropped since the last :meth:`next` that reported it."""
        return self._overflowed

    def offer(self, event: StoredEvent, size: int | None = None) -> None:
        """Called on the event loop by the hub; ``size``: the event's bytes (default: its
        payload's UTF-8 length). An event past either bound is dropped and marks an
        overflow (the follower reads the store instead); never blocks."""
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
        """The next live event, or None after ``timeout`` seconds or an overflow (read the store then)."""
        if self._overflowed:
            while not self._queue.empty():
                self._queue.get_nowait()
            self._bytes = 0
            self._overflowed = False
            return None
        try:
            event, size = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None
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

    Raises:
        KeyMaterialError: (constructor) the keyring is set and cannot be used.
    """

    def __init__(
        self,
        settings: TurnlogSettings,
        *,
        consumer_config: dict[str, Any] | None = None,
        on_following: Callable[[], object] | None = None,
    ) -> None:
        self.settings = settings
        self._on_following = on_following
        self._group_id = f"{settings.topic_prefix}-live-{uuid.uuid4().hex[:8]}"  # required by the client; never joined
        self._config = {"enable.auto.offset.store": False, **(consumer_config or {})}
        self._subscribers: dict[str, set[Subscription]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opener = event_opener(settings)

    def start(self) -> None:
        """Start consuming in a daemon thread; call from the event loop that subscribers use."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="transcript-hub", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def subscribe(self, session_id: str, *, max_bytes: int = SUBSCRIPTION_QUEUE_BYTES) -> Subscription:
        subscription = Subscription(session_id, max_bytes=max_bytes)
        with self._lock:
            self._subscribers.setdefault(session_id, set()).add(subscription)
        return subscription

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
        consumer = kafka.consumer(self.settings, group_id=self._group_id, **self._config)
        offsets = kafka.OffsetReader(self.settings)
        try:
            partitions = self._partitions(offsets, topic)
            if partitions is None:
                return  # stopped before the topic was found
            offsets.close()
            consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in partitions])
            logger.info("transcript hub: following %d partitions of %s", len(partitions), topic)
            if self._on_following is not None:
                self._on_following()
            while not self._stopping.is_set():
                record = consumer.poll(0.5)
                if record is None or record.error() is not None:
                    continue
                self._handle(record)
        finally:
            consumer.close()

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
        with self._lock:
            subscribers = list(self._subscribers.get(key.decode("utf-8", "replace"), ()))
        if not subscribers:
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
    """
    subscription = hub.subscribe(session_id, max_bytes=queue_bytes) if hub is not None else None
    last = after_seq
    try:
        while True:
            while True:  # the store: backlog, or a gap's fill
                page = await fetch(session_id, last)
                for event in page.events:
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
