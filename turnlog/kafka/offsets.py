"""Committed offsets and watermarks: the one place turnlog looks them up.

Every lookup goes through long-lived lookup consumers (made on first use, kept,
never subscribed) and one retry policy (:func:`lookup_retry`): up to
``LOOKUP_ATTEMPTS`` tries within ``LOOKUP_BUDGET_SECONDS``, backing off from
0.2 s, retried only while the error is retriable (the broker's own flag). A caller with a deadline
of its own passes it and the lookup stops there instead.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

from turnlog.kafka.client_errors import broker_errors, to_broker_error
from turnlog.kafka.clients import consumer as consumer_for
from turnlog.kafka.exceptions import BrokerError, BrokerUnavailableError, UnknownTopicError
from turnlog.settings import TurnlogSettings

__all__ = ["OffsetReader", "Watermarks", "lookup_retry", "LOOKUP_ATTEMPTS", "LOOKUP_BUDGET_SECONDS"]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Tries of one lookup while the broker is unavailable.
LOOKUP_ATTEMPTS = 4
#: Longest one lookup takes, retries included (seconds).
LOOKUP_BUDGET_SECONDS = 10.0
#: Longest one request to the broker waits (seconds).
REQUEST_TIMEOUT_SECONDS = 5.0
#: Longest a lookup waits for the metadata refresh it asks for after a failed request (seconds):
#: the answer updates the client's metadata when it comes, whether or not it was waited for.
METADATA_REFRESH_WAIT_SECONDS = 0.2
#: Records read back from a partition's end to find its last committed record (a transaction
#: writes one marker per partition it touched; each further window is this many times longer).
RECORD_END_WINDOW = 16


@dataclass(frozen=True, slots=True)
class Watermarks:
    """A partition's offsets: ``low`` is the first retained record, ``high`` the next to be written."""

    low: int
    high: int


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    logger.info("Kafka lookup: broker unavailable, retrying (attempt %d): %s", state.attempt_number, error)


def lookup_retry(lookup: Callable[[float], _T], what: str, *, deadline: float | None = None) -> _T:
    """``lookup(request timeout in seconds)`` under the layer's one retry policy (see the
    module docstring), with client errors converted; ``deadline`` (``time.monotonic()``)
    ends the retries earlier.

    Raises:
        BrokerUnavailableError: the broker stayed unavailable through every attempt.
        BrokerError: another broker error (not retried).
    """
    ends = time.monotonic() + LOOKUP_BUDGET_SECONDS
    if deadline is not None:
        ends = min(ends, deadline)

    def attempt() -> _T:
        timeout = max(0.1, min(REQUEST_TIMEOUT_SECONDS, ends - time.monotonic()))
        with broker_errors(what):
            try:
                return lookup(timeout)
            except concurrent.futures.TimeoutError as e:  # an admin future outlived its request
                raise BrokerUnavailableError(f"{what}: no answer in {timeout:.1f} s", retriable=True) from e

    retrying = Retrying(
        # Retriable by the broker's own flag: a restarting broker answers
        # UNKNOWN_TOPIC_OR_PART or NOT_LEADER for a while, not only "unavailable".
        retry=retry_if_exception(lambda e: isinstance(e, BrokerError) and e.retriable),
        # stop_after_attempt(LOOKUP_ATTEMPTS) or the deadline (tenacity types `|` for its own stop classes only).
        stop=lambda state: state.attempt_number >= LOOKUP_ATTEMPTS or time.monotonic() >= ends,
        wait=wait_exponential(multiplier=0.2, max=2.0),
        before_sleep=_log_retry,
        reraise=True,
    )
    return retrying(attempt)


class OffsetReader:
    """Offsets lookups (blocking: run them in a worker thread). No I/O until the first one.

    Lookups go through consumers that never subscribe (so they never join a
    group): one per group whose commits are read, and one for watermarks.
    Not the admin API: librdkafka 2.16's admin requests abort the process
    (``rd_kafka_enq_once_del_source_return: Assertion `eonce->refcnt > 0'``,
    confluent-kafka-python#1640) when the broker goes away mid-request, which
    chaos's broker outages hit in the sequencer and in resuming agents.

    Every method takes an optional ``deadline`` (``time.monotonic()``) and raises:
        BrokerUnavailableError: the broker did not answer (after the retries).
        UnknownTopicError: the topic or a partition does not exist.
        BrokerError: another broker error.
    """

    def __init__(self, settings: TurnlogSettings, **overrides: Any) -> None:
        self._settings = settings
        self._overrides = overrides
        self._consumers: dict[str, Consumer] = {}
        self._watermarks_group = f"turnlog-offsets-{uuid.uuid4()}"  # never commits
        self._lock = threading.Lock()

    def _consumer(self, group_id: str) -> Consumer:
        consumer = self._consumers.get(group_id)
        if consumer is None:
            consumer = self._consumers[group_id] = consumer_for(self._settings, group_id=group_id, **self._overrides)
        return consumer

    def partitions(self, topic: str, *, deadline: float | None = None) -> list[int]:
        """The topic's partition numbers, sorted."""

        def lookup(timeout: float) -> list[int]:
            with self._lock:
                metadata = self._consumer(self._watermarks_group).list_topics(topic=topic, timeout=timeout)
                found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                error = found.error if found is not None else None
                if error is not None and to_broker_error(error).retriable:
                    raise to_broker_error(error, f"partitions of {topic}")
                raise UnknownTopicError(f"topic {topic} does not exist", code=error.code() if error else None)
            return sorted(found.partitions)

        return lookup_retry(lookup, f"partitions of {topic}", deadline=deadline)

    def committed(
        self, group_id: str, topic: str, partitions: Iterable[int], *, deadline: float | None = None
    ) -> dict[int, int | None]:
        """``{partition: next offset group_id committed}``; None where it committed none."""
        wanted = sorted(set(partitions))
        if not wanted:
            return {}

        def lookup(timeout: float) -> dict[int, int | None]:
            with self._lock:
                answer = self._consumer(group_id).committed([TopicPartition(topic, p) for p in wanted], timeout=timeout)
            offsets: dict[int, int | None] = {}
            for tp in answer:
                if tp.error is not None:
                    raise to_broker_error(tp.error, f"committed offsets of {group_id} on {topic}[{tp.partition}]")
                offsets[tp.partition] = None if tp.offset < 0 else tp.offset
            return offsets

        return lookup_retry(lookup, f"committed offsets of {group_id} on {topic}", deadline=deadline)

    def end_offsets(
        self, topic: str, partitions: Iterable[int] | None = None, *, deadline: float | None = None
    ) -> dict[int, int]:
        """``{partition: high watermark}`` (the next offset to be written); every partition when None."""
        return {p: marks.high for p, marks in self.watermarks(topic, partitions, deadline=deadline).items()}

    def watermarks(
        self, topic: str, partitions: Iterable[int] | None = None, *, deadline: float | None = None
    ) -> dict[int, Watermarks]:
        """``{partition: Watermarks(low, high)}``; every partition when None."""
        wanted = self.partitions(topic, deadline=deadline) if partitions is None else sorted(set(partitions))

        def lookup(timeout: float) -> dict[int, Watermarks]:
            with self._lock, self._refreshing_leaders(topic):
                consumer = self._consumer(self._watermarks_group)
                found = {}
                for p in wanted:
                    try:
                        low, high = consumer.get_watermark_offsets(
                            TopicPartition(topic, p), timeout=timeout, cached=False
                        )
                    except KafkaException as e:
                        if e.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                            raise
                        # The client's metadata lacks the partition, as it may for a while when its
                        # leader died: retried (after the metadata refresh) until the budget ends.
                        raise UnknownTopicError(
                            f"watermarks of {topic}[{p}]: the partition is not in the client's metadata",
                            code=KafkaError._UNKNOWN_PARTITION, retriable=True,
                        ) from e
                    found[p] = Watermarks(low, high)
            return found

        return lookup_retry(lookup, f"watermarks of {topic}", deadline=deadline) if wanted else {}

    def record_ends(
        self, topic: str, partitions: Iterable[int] | None = None, *, deadline: float | None = None
    ) -> dict[int, int]:
        """``{partition: the offset after its last committed record}`` (every partition when None):
        where a ``read_committed`` consumer that read everything has its position, as a consumer's
        stored offsets count it (the last record's offset + 1); the low watermark when the
        partition holds no committed record. Below the high watermark when the partition ends
        in transaction markers or aborted records, which no consumer is ever given: a reader
        waiting for the high watermark would wait for good behind a transactional writer."""
        found = {}
        for partition, marks in self.watermarks(topic, partitions, deadline=deadline).items():
            if marks.high <= marks.low:
                found[partition] = marks.low
                continue

            def lookup(timeout: float, partition: int = partition, marks: Watermarks = marks) -> int:
                with self._lock, self._refreshing_leaders(topic):
                    return self._last_record_end(topic, partition, marks, timeout)

            found[partition] = lookup_retry(lookup, f"the last record of {topic}[{partition}]", deadline=deadline)
        return found

    def _last_record_end(self, topic: str, partition: int, marks: Watermarks, timeout: float) -> int:
        """Read back from the high watermark, a window at a time (each ``RECORD_END_WINDOW`` times
        longer than the last), until a committed record is found. Call it holding ``_lock``.

        Raises:
            BrokerUnavailableError: the partition was not read up to ``marks.high`` in ``timeout``
                seconds (retriable).
        """
        consumer = self._consumer(self._watermarks_group)
        deadline = time.monotonic() + timeout
        window = RECORD_END_WINDOW
        end = marks.high
        while end > marks.low:
            start = max(marks.low, end - window)
            last: int | None = None
            consumer.assign([TopicPartition(topic, partition, start)])
            try:
                while True:
                    for message in consumer.consume(RECORD_END_WINDOW, timeout=0.1):
                        offset = message.offset()
                        if (message.error() is None and offset is not None and offset < end
                                and message.topic() == topic and message.partition() == partition):
                            last = offset
                    (position,) = consumer.position([TopicPartition(topic, partition)])
                    if position.offset >= end:
                        break
                    if time.monotonic() >= deadline:
                        # Retriable: a broker that has just restarted serves a partition only
                        # once it has recovered the partition's log (up to a minute after a SIGKILL).
                        raise BrokerUnavailableError(
                            f"the last record of {topic}[{partition}]: not read up to offset {end} "
                            f"in {timeout:g} s (position {position.offset})", retriable=True,
                        )
            finally:
                consumer.unassign()
            if last is not None:
                return last + 1
            end, window = start, window * RECORD_END_WINDOW
        return marks.low

    def offsets_for_time(
        self, topic: str, partitions: Iterable[int], timestamp_ms: int, *, deadline: float | None = None
    ) -> dict[int, int | None]:
        """``{partition: first offset whose timestamp >= timestamp_ms}``; None where no record is that recent."""
        wanted = sorted(set(partitions))

        def lookup(timeout: float) -> dict[int, int | None]:
            with self._lock, self._refreshing_leaders(topic):
                answer = self._consumer(self._watermarks_group).offsets_for_times(
                    [TopicPartition(topic, p, timestamp_ms) for p in wanted], timeout=timeout
                )
            found: dict[int, int | None] = {}
            for tp in answer:
                if tp.error is not None:
                    raise to_broker_error(tp.error, f"offsets by time of {topic}[{tp.partition}]")
                found[tp.partition] = tp.offset if tp.offset >= 0 else None
            return found

        return lookup_retry(lookup, f"offsets by time of {topic}", deadline=deadline) if wanted else {}

    @contextlib.contextmanager
    def _refreshing_leaders(self, topic: str) -> Iterator[None]:
        """On a failed request to a partition leader, refresh the topic's metadata before the
        error goes on (to be retried). These consumers subscribe to nothing, so librdkafka
        refreshes their metadata only every ``topic.metadata.refresh.interval.ms`` (5 min): a
        dead leader stayed their leader that long, and every lookup timed out. Call it holding
        ``_lock``."""
        try:
            yield
        except (KafkaException, BrokerError):
            try:  # asked, not waited out: a broker that does not answer must not stretch the lookup's budget
                self._consumer(self._watermarks_group).list_topics(topic=topic, timeout=METADATA_REFRESH_WAIT_SECONDS)
            except KafkaException as refresh_error:
                logger.info("Kafka lookup: metadata of %s not refreshed: %s", topic, refresh_error)
            raise

    def close(self) -> None:
        """Close the lookup consumers (a later lookup makes new ones)."""
        with self._lock:
            consumers, self._consumers = list(self._consumers.values()), {}
        for consumer in consumers:
            consumer.close()

    def __enter__(self) -> OffsetReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
