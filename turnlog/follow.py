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
from turnlog.schemas import EventValidationError, decode_event
from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import SqlStore
from turnlog.sinks.reads import EventPage, StoredEvent, events_after

__all__ = ["TranscriptHub", "Subscription", "follow_session", "store_fetch", "SESSION_ENDED"]

logger = logging.getLogger(__name__)

SESSION_ENDED = "session.ended"
#: Live events one subscriber may hold before it falls back to the store.
SUBSCRIPTION_QUEUE_SIZE = 1024

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


def store_fetch(store: SqlStore) -> Fetch:
    """A :data:`Fetch` over ``store`` (each read in a worker thread, on its own connection)."""

    def read(session_id: str, after_seq: int) -> EventPage:
        with store.engine.connect() as conn:
            return events_after(conn, session_id, after_seq)

    async def fetch(session_id: str, after_seq: int) -> EventPage:
        return await asyncio.to_thread(read, session_id, after_seq)

    return fetch


class Subscription:
    """The live events of one session for one follower (an asyncio queue, bounded)."""

    def __init__(self, session_id: str, maxsize: int = SUBSCRIPTION_QUEUE_SIZE) -> None:
        self.session_id = session_id
        self._queue: asyncio.Queue[StoredEvent] = asyncio.Queue(maxsize)
        self._overflowed = False

    def offer(self, event: StoredEvent) -> None:
        """Called on the event loop by the hub. A full queue marks an overflow, never blocks."""
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self._overflowed = True

    async def next(self, timeout: float) -> StoredEvent | None:
        """The next live event, or None after ``timeout`` seconds or an overflow (read the store then)."""
        if self._overflowed:
            while not self._queue.empty():
                self._queue.get_nowait()
            self._overflowed = False
            return None
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None


class TranscriptHub:
    """One consumer of ``<prefix>.transcript`` per process, fanned out by session id.

    It joins no consumer group (it is assigned every partition at its end
    offset and commits nothing), so every API process sees every record and
    none steals partitions from another. Records are decoded only when their
    session has a subscriber.

    ``on_following`` (optional) is called once, in the hub's thread, when the
    consumer is assigned every partition of the topic (the API's readiness).
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

    def start(self) -> None:
        """Start consuming in a daemon thread; call from the event loop that subscribers use."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="transcript-hub", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def subscribe(self, session_id: str) -> Subscription:
        subscription = Subscription(session_id)
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
                self._dispatch(record.key(), record.value())
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

    def _dispatch(self, key: bytes | None, value: bytes | None) -> None:
        if key is None or value is None:
            return
        with self._lock:
            subscribers = list(self._subscribers.get(key.decode("utf-8", "replace"), ()))
        if not subscribers:
            return
        try:
            event = decode_event(value)
        except EventValidationError:
            return  # the sink dead-letters it; followers never see it
        live = StoredEvent(event.seq, str(type(event).__struct_config__.tag), value.decode("utf-8"))
        assert self._loop is not None
        for subscription in subscribers:
            self._loop.call_soon_threadsafe(subscription.offer, live)


async def follow_session(
    fetch: Fetch,
    hub: TranscriptHub | None,
    session_id: str,
    after_seq: int = -1,
    *,
    poll_seconds: float = 1.0,
) -> AsyncIterator[StoredEvent]:
    """Every event of ``session_id`` with ``seq > after_seq``, each once, in seq order,
    until ``session.ended``, or at once if the store says nothing can follow
    ``after_seq`` (see the module docstring for the rule)."""
    subscription = hub.subscribe(session_id) if hub is not None else None
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
            while True:  # the live tail, until it has a gap or goes quiet
                if subscription is None:
                    await asyncio.sleep(poll_seconds)
                    break
                live = await subscription.next(poll_seconds)
                if live is None or live.seq > last + 1:
                    break
                if live.seq <= last:
                    continue  # a duplicate (the sequencer re-emitted it, or the store gave it already)
                yield live
                last = live.seq
                if live.type == SESSION_ENDED:
                    return
    finally:
        if subscription is not None and hub is not None:
            hub.unsubscribe(subscription)
