"""A recorder's view of the erasure ledger ``<prefix>.erasures`` (docs/design.md, "Encryption and erasure").

The ledger is compacted and only grows: one small record (~300 bytes) per
forgotten session, key = session id, never tombstoned (``schemas/erasure.py``).
:class:`ErasureWatch` reads it from the start when the recorder starts, then
follows it, on a thread of its own with its own consumer (no consumer group:
every partition is assigned, nothing is committed).

Memory is bounded by what the recorder holds, not by the ledger: a record is
kept only as long as it takes to hand it to ``on_erased``, and only if
``relevant(session_id)`` says the session matters here (the spool holds
events of it, or the recorder records it). A session that becomes relevant
after its record was read (a dead recorder's spool adopted later) is looked
up by :meth:`ErasureWatch.check`: the ledger is read again from the start,
and the check resolves once that pass reached the end.

A broker outage never blocks recording: the thread retries with a capped
backoff, and only the checks (which hold adopted rows back from delivery,
``producers/drainer.py``) wait, as delivery would anyway. A ledger topic
that does not exist is an empty ledger (its metadata is asked again every
``TOPIC_RECHECK_SECONDS``). A ledger this recorder may not read (the broker's
ACLs) is logged as an error and treated as empty: holding the spool forever
would lose every session's delivery for one missing grant.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from turnlog import kafka
from turnlog.crypto.ledger_signatures import ledger_verifier
from turnlog.kafka.client_errors import UNAVAILABLE_CODES
from turnlog.schemas.erasure import Erasure
from turnlog.schemas.exceptions import EventValidationError
from turnlog.settings import TurnlogSettings

__all__ = ["ErasureWatch", "TOPIC_RECHECK_SECONDS"]

logger = logging.getLogger(__name__)
#: How often the ledger topic's metadata is asked again (seconds): a topic created later, or more partitions.
TOPIC_RECHECK_SECONDS = 30.0
#: Waits after a broker error (seconds): doubling from the first, capped.
RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS = 0.5, 5.0
_METADATA_TIMEOUT_SECONDS = 5.0
_POLL_SECONDS = 0.2
_BATCH = 500
#: Codes that mean this recorder may not read the ledger at all (an ACL), as opposed to an outage.
_DENIED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED})


class _LedgerDenied(Exception):
    """The broker refuses this recorder the ledger topic (an ACL)."""


class ErasureWatch:
    """Follows ``<prefix>.erasures`` and reports the records of sessions that matter here.

    ``relevant(session_id)`` is called on this watch's thread for every record read
    (it must be cheap and thread-safe); ``on_erased(erasures)`` gets the relevant ones,
    a batch at a time, also on this thread. No I/O in the constructor.
    """

    def __init__(
        self,
        settings: TurnlogSettings,
        *,
        relevant: Callable[[str], bool],
        on_erased: Callable[[list[Erasure]], None],
    ) -> None:
        self.settings = settings
        self.topic = settings.topics.erasures
        self._relevant = relevant
        self._ledger = ledger_verifier(settings)  # ConfigurationError: a malformed issuer key
        self._on_erased = on_erased
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        #: checks waiting for the next pass from the start; those of the pass running now
        self._waiting: list[tuple[frozenset[str], concurrent.futures.Future[None]]] = []
        self._in_pass: list[tuple[frozenset[str], concurrent.futures.Future[None]]] = []
        self._caught_up = threading.Event()
        self._failures = 0

    @property
    def caught_up(self) -> bool:
        """True once the ledger was read to its end at least once (or found empty, missing or denied)."""
        return self._caught_up.is_set()

    def start(self) -> None:
        """Start reading the ledger from its start (returns at once; the reading is on a thread).
        Checks asked before this call are answered by this first pass."""
        if self._thread is not None:
            return
        with self._lock:
            self._in_pass, self._waiting = self._waiting, []
        self._thread = threading.Thread(target=self._run, name="turnlog-erasure-watch", daemon=True)
        self._thread.start()

    def check(self, session_ids: Iterable[str]) -> concurrent.futures.Future[None]:
        """Make sure the ledger's records of ``session_ids`` reach ``on_erased`` even if they were
        read before the sessions mattered here: resolves (``None``) once a pass from the ledger's
        start has reached its end; the callers' ``relevant`` must hold for them from this call on.
        Several checks share one pass. After :meth:`close`, the future is cancelled."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            if self._stop.is_set():
                done.cancel()
                return done
            self._waiting.append((frozenset(session_ids), done))
        self._wake.set()
        return done

    def wait_caught_up(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the first pass to reach the ledger's end; True if it did."""
        return self._caught_up.wait(timeout)

    def close(self) -> None:
        """Stop the thread (within about ``_POLL_SECONDS``) and cancel the checks left."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        with self._lock:
            left, self._waiting, self._in_pass = self._waiting + self._in_pass, [], []
        for _, future in left:
            future.cancel()

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            consumer: Consumer | None = None
            try:
                consumer = kafka.consumer(
                    self.settings, group_id=f"{self.settings.topic_prefix}-erasure-watch",
                    **{"enable.partition.eof": True, "auto.offset.reset": "earliest",
                       "enable.auto.offset.store": False},
                )
                self._follow(consumer)
            except _LedgerDenied:
                logger.error(
                    "erasure ledger %s: this recorder may not read it (the broker's ACLs); forgotten sessions are "
                    "NOT dropped from this host's spool until it may (grant read on the topic)", self.topic,
                )
                self._passed_the_end()
                self._stop.wait(TOPIC_RECHECK_SECONDS)
            except Exception as e:  # a broker outage or a broker error: never the end of the watch
                self._failures += 1
                wait = min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2 ** min(self._failures - 1, 16))
                logger.warning("erasure ledger %s not readable now (%s); reading it again from the start in %.1f s",
                               self.topic, type(e).__name__, wait)
                self._stop.wait(wait)
            finally:
                if consumer is not None:
                    consumer.close()

    def _follow(self, consumer: Consumer) -> None:
        """Read every partition from the start; at the end of all of them, resolve the pass's
        checks; start a new pass when checks wait; until the stop. Raises on a broker error."""
        partitions = self._partitions(consumer)
        self._assign_from_start(consumer, partitions)
        at_end: set[int] = set()
        recheck_at = time.monotonic() + TOPIC_RECHECK_SECONDS
        while not self._stop.is_set():
            if partitions and at_end >= set(partitions):
                self._failures = 0
                self._passed_the_end()
            elif not partitions:
                self._passed_the_end()
            with self._lock:
                new_pass = bool(self._waiting) and not self._in_pass
                if new_pass:
                    self._in_pass, self._waiting = self._waiting, []
            if new_pass:
                at_end.clear()
                self._assign_from_start(consumer, partitions)
            if time.monotonic() >= recheck_at:
                recheck_at = time.monotonic() + TOPIC_RECHECK_SECONDS
                now = self._partitions(consumer)
                if now != partitions:  # created, or partitions added: read the new ones from the start
                    partitions = now
                    at_end.clear()
                    self._assign_from_start(consumer, partitions)
            if not partitions:
                self._wake.wait(_POLL_SECONDS * 5)
                self._wake.clear()
                continue
            erased: list[Erasure] = []
            for record in consumer.consume(_BATCH, _POLL_SECONDS):
                error = record.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(record.partition() or 0)
                    elif error.code() in _DENIED:
                        raise _LedgerDenied()
                    elif error.code() not in UNAVAILABLE_CODES and (error.fatal() or not error.retriable()):
                        raise KafkaException(error)
                    continue
                try:
                    erasure = self._ledger.read(record.key(), record.value(), record.headers()).erasure
                except EventValidationError:
                    continue  # unsigned, forged or unreadable: nothing to forget (the sink dead-letters it)
                if self._wanted(erasure.session_id):
                    erased.append(erasure)
            if erased:
                self._on_erased(erased)

    def _wanted(self, session_id: str) -> bool:
        if self._relevant(session_id):
            return True
        with self._lock:
            return any(session_id in ids for ids, _ in self._in_pass)

    def _partitions(self, consumer: Consumer) -> list[int]:
        """The ledger's partitions; [] when the topic does not exist.

        Raises:
            _LedgerDenied: this recorder may not describe it. KafkaException: no metadata in time.
        """
        deadline = time.monotonic() + _METADATA_TIMEOUT_SECONDS
        while True:  # in short asks, so that close() is not kept waiting by a broker away
            try:
                metadata = consumer.list_topics(self.topic, timeout=_POLL_SECONDS)
                break
            except KafkaException:
                if self._stop.is_set() or time.monotonic() >= deadline:
                    raise
        topic = metadata.topics.get(self.topic)
        if topic is None:
            return []
        if topic.error is not None:
            if topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return []
            if topic.error.code() in _DENIED:
                raise _LedgerDenied()
            raise KafkaException(topic.error)
        return sorted(topic.partitions)

    def _assign_from_start(self, consumer: Consumer, partitions: Collection[int]) -> None:
        consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in sorted(partitions)])

    def _passed_the_end(self) -> None:
        """A pass reached the end of every partition: the first catch-up is done, the pass's checks too."""
        self._caught_up.set()
        with self._lock:
            done, self._in_pass = self._in_pass, []
        for _, future in done:
            if not future.done():
                future.set_result(None)
