"""Committed offsets and watermarks: the one place turnlog looks them up.

Every lookup goes through one admin client (made on first use, kept, safe to
share between threads) and one retry policy (:func:`lookup_retry`): up to
``LOOKUP_ATTEMPTS`` tries within ``LOOKUP_BUDGET_SECONDS``, backing off from
0.2 s, retried only while the error is retriable (the broker's own flag). A caller with a deadline
of its own passes it and the lookup stops there instead.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import ConsumerGroupTopicPartitions, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from turnlog.kafka.clients import admin
from turnlog.kafka.errors import broker_errors, to_broker_error
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
#: librdkafka's "no offset" (OFFSET_INVALID): the group committed nothing there.
_NO_OFFSET = -1001


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
        stop=stop_after_attempt(LOOKUP_ATTEMPTS) | (lambda _: time.monotonic() >= ends),
        wait=wait_exponential(multiplier=0.2, max=2.0),
        before_sleep=_log_retry,
        reraise=True,
    )
    return retrying(attempt)


class OffsetReader:
    """Offsets lookups (blocking: run them in a worker thread). No I/O until the first one.

    Every method takes an optional ``deadline`` (``time.monotonic()``) and raises:
        BrokerUnavailableError: the broker did not answer (after the retries).
        UnknownTopicError: the topic or a partition does not exist.
        BrokerError: another broker error.
    """

    def __init__(self, settings: TurnlogSettings, **admin_overrides: Any) -> None:
        self._settings = settings
        self._overrides = admin_overrides
        self._admin: AdminClient | None = None
        self._has_metadata = False
        self._lock = threading.Lock()

    def _client(self) -> AdminClient:
        with self._lock:
            if self._admin is None:
                self._admin = admin(self._settings, **self._overrides)
                self._has_metadata = False
            return self._admin

    def partitions(self, topic: str, *, deadline: float | None = None) -> list[int]:
        """The topic's partition numbers, sorted."""

        def lookup(timeout: float) -> list[int]:
            found = self._client().list_topics(topic=topic, timeout=timeout).topics.get(topic)
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
            request = ConsumerGroupTopicPartitions(group_id, [TopicPartition(topic, p) for p in wanted])
            future = self._client().list_consumer_group_offsets([request], request_timeout=timeout)[group_id]
            answer = future.result(timeout=timeout + 1.0)
            offsets: dict[int, int | None] = {}
            for tp in answer.topic_partitions:
                if tp.error is not None:
                    raise to_broker_error(tp.error, f"committed offsets of {group_id} on {topic}[{tp.partition}]")
                offsets[tp.partition] = None if tp.offset == _NO_OFFSET else tp.offset
            return offsets

        return lookup_retry(lookup, f"committed offsets of {group_id} on {topic}", deadline=deadline)

    def end_offsets(
        self, topic: str, partitions: Iterable[int] | None = None, *, deadline: float | None = None
    ) -> dict[int, int]:
        """``{partition: high watermark}`` (the next offset to be written); every partition when None."""
        wanted = self.partitions(topic, deadline=deadline) if partitions is None else partitions
        return self._list_offsets(topic, wanted, OffsetSpec.latest(), "end offsets", deadline)

    def watermarks(
        self, topic: str, partitions: Iterable[int] | None = None, *, deadline: float | None = None
    ) -> dict[int, Watermarks]:
        """``{partition: Watermarks(low, high)}``; every partition when None."""
        wanted = self.partitions(topic, deadline=deadline) if partitions is None else sorted(set(partitions))
        low = self._list_offsets(topic, wanted, OffsetSpec.earliest(), "low watermarks", deadline)
        high = self._list_offsets(topic, wanted, OffsetSpec.latest(), "high watermarks", deadline)
        return {p: Watermarks(low[p], high[p]) for p in wanted}

    def offsets_for_time(
        self, topic: str, partitions: Iterable[int], timestamp_ms: int, *, deadline: float | None = None
    ) -> dict[int, int | None]:
        """``{partition: first offset whose timestamp >= timestamp_ms}``; None where no record is that recent."""
        found = self._list_offsets(topic, partitions, OffsetSpec.for_timestamp(timestamp_ms), "offsets by time", deadline)
        return {p: (offset if offset >= 0 else None) for p, offset in found.items()}

    def _list_offsets(
        self, topic: str, partitions: Iterable[int], spec: OffsetSpec, what: str, deadline: float | None
    ) -> dict[int, int]:
        wanted = sorted(set(partitions))
        if not wanted:
            return {}

        def lookup(timeout: float) -> dict[int, int]:
            client = self._client()
            if not self._has_metadata:
                # A fresh client's first ListOffsets, sent before it has the
                # topic's metadata, waits about 3 s in about one call in eight
                # (librdkafka 2.x, measured here); asking for it first brings
                # that to tens of milliseconds.
                client.list_topics(topic=topic, timeout=timeout)
                self._has_metadata = True
            futures = client.list_offsets(
                {TopicPartition(topic, p): spec for p in wanted},
                isolation_level=IsolationLevel.READ_COMMITTED,  # what turnlog's consumers read up to
                request_timeout=timeout,
            )
            return {tp.partition: future.result(timeout=timeout + 1.0).offset for tp, future in futures.items()}

        return lookup_retry(lookup, f"{what} of {topic}", deadline=deadline)

    def close(self) -> None:
        """Drop the admin client (a later lookup makes a new one)."""
        with self._lock:
            self._admin = None

    def __enter__(self) -> OffsetReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
