"""Consumer lag per group and partition, read from outside the consumers.

A consumer that is paused, frozen (SIGSTOP, a GC pause) or dead cannot report
its own lag, so :class:`LagMonitor` reads it as a bystander: the group's
committed offsets (Kafka's for a Faust app; the ``sink_offsets`` rows for the
sink and the analytics projection, read by a function the composer passes in,
since this layer does not import ``sinks``), each partition's end offset, and
the record at the committed offset (its timestamp gives the lag in seconds).

One read costs, per group and topic, one committed-offsets lookup and one
watermarks lookup, then one fetch per lagging partition, all through the
monitor's own consumers (never subscribed, never committing) and within one
deadline. :meth:`LagMonitor.snapshot` serves the last read while it is younger
than the refresh interval, so scrapes and page refreshes never multiply that work.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from turnlog.kafka.client_errors import broker_errors
from turnlog.kafka.clients import consumer as consumer_for
from turnlog.kafka.exceptions import BrokerError, UnknownTopicError
from turnlog.kafka.offsets import OffsetReader, Watermarks
from turnlog.metrics import CONSUMER_LAG_RECORDS, CONSUMER_LAG_SECONDS
from turnlog.settings import TurnlogSettings

__all__ = ["PartitionLag", "CommittedSource", "StoredOffsets", "LagMonitor", "pipeline_groups", "publish_every"]

logger = logging.getLogger(__name__)

#: ``stored(topics) -> {(topic, partition): next offset}`` a group keeps outside Kafka; a
#: partition it has no offset for is missing. Called from the monitor's thread.
StoredOffsets = Callable[[Sequence[str]], Mapping[tuple[str, int], int]]

#: Bytes one partition's fetch asks for: the record at the committed offset is all a read needs
#: (the broker still returns a larger first record whole).
_FETCH_BYTES = 64 * 1024
#: Distinct end offsets remembered per partition (:meth:`LagMonitor._absent_at`).
_ENDS_KEPT = 64


@dataclass(frozen=True)
class PartitionLag:
    """One partition's lag for one consumer group, at one read.

    ``committed`` is the next offset the group will process (None: it stored none for this
    partition, so it starts at the first retained record); ``end`` the partition's last
    stable offset (a ``read_committed`` reader's end); ``records`` is ``end`` minus where the
    group stands (0 when only transaction markers or aborted records are left before
    ``end``); ``seconds`` is the read's time minus the timestamp of the first record the
    group has not processed (0 when caught up; NaN when that record was not fetched
    before the read's deadline, or carries no timestamp (0 or less) and no earlier read
    bounds its age), clamped to at least 0 and at most the time since a read
    of the same monitor saw the partition end at or before that record: the timestamp is
    the producer's (CreateTime), and a record stamped in 1970 or by a skewed clock must not
    read as decades of lag (the first read of a partition has no such bound yet).
    """

    group: str
    topic: str
    partition: int
    committed: int | None
    end: int
    records: int
    seconds: float


@dataclass(frozen=True)
class CommittedSource:
    """A consumer group and the topics it consumes; ``stored`` reads the offsets it keeps in
    its own store (the sink's ``sink_offsets``), None when it commits them to Kafka."""

    group: str
    topics: tuple[str, ...]
    stored: StoredOffsets | None = None


def pipeline_groups(settings: TurnlogSettings, *, stored_offsets: Callable[[str, Sequence[str]],
                    Mapping[tuple[str, int], int]]) -> list[CommittedSource]:
    """The pipeline's consumer groups: the sequencer's (Faust, commits to Kafka) on
    ``<prefix>.events``; the sink's and the analytics projection's on ``<prefix>.transcript``
    and ``<prefix>.erasures``, whose offsets ``stored_offsets(group, topics)`` reads from the
    store (``turnlog.sinks.offsets.stored_group_offsets``). The
    finalizer's Faust app consumes no topic of the pipeline and has no lag."""
    topics = settings.topics

    def stored_by(group: str) -> StoredOffsets:
        return lambda names: stored_offsets(group, names)

    return [
        CommittedSource(settings.sequencer_group, (topics.events,)),
        CommittedSource(settings.sink_group, (topics.transcript, topics.erasures), stored_by(settings.sink_group)),
        CommittedSource(settings.analytics_group, (topics.transcript, topics.erasures),
                        stored_by(settings.analytics_group)),
    ]


class LagMonitor:
    """Reads the lag of ``committed_sources`` and publishes it as ``turnlog_consumer_lag_records``
    and ``turnlog_consumer_lag_seconds`` (labels group, topic, partition).

    A group that has no committed offset at all (Kafka) or no stored row at all (its store)
    is not running here and is not reported. A group whose offsets could not be read (the
    broker or the store unavailable, or a store that did not answer within half the read's
    time) is left out of that read, and its series are removed
    when the read is published: a missing series, not a stale value. So is a topic that does
    not exist (deleted): the other topics' lag is still read.

    Blocking: call it from a thread of its own (the exporter's loop; the API's worker thread).
    Thread-safe: reads are serialized.
    """

    def __init__(
        self,
        settings: TurnlogSettings,
        *,
        committed_sources: Sequence[CommittedSource],
        refresh_seconds: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._sources = list(committed_sources)
        self._refresh_seconds = refresh_seconds
        self._clock = clock
        self._offsets = OffsetReader(settings)
        self._fetcher: Consumer | None = None
        self._lock = threading.Lock()
        self._last: list[PartitionLag] | None = None
        self._last_read_at = -math.inf  # time.monotonic() of the last read
        self._published: set[tuple[str, str, str]] = set()
        #: (topic, partition) -> (time, end) of past reads, ends increasing: bounds a record's age
        #: whatever its timestamp says (a producer sets it: a record stamped 1970 is not 56 years old)
        self._ends_seen: dict[tuple[str, int], collections.deque[tuple[float, int]]] = {}
        #: the stored offsets' reads (CommittedSource.stored) by group, each on a daemon thread
        self._stored_calls: dict[str, _DaemonCall] = {}
        #: the groups whose offsets the last read could not get (an error or a store past its
        #: time), left out of its answer; a group with no offsets at all is not among them
        self.unread_groups: tuple[str, ...] = ()

    def read(self, timeout: float) -> list[PartitionLag]:
        """Read every group's lag now, within ``timeout`` seconds: one snapshot, sorted by
        (group, topic, partition). Each group's committed offsets are read before the
        partitions' ends, so ``records`` is never negative.

        Raises:
            BrokerUnavailableError: the broker did not answer the end-offset lookups in time.
            BrokerError: another broker error on those lookups.
        """
        with self._lock:
            deadline = time.monotonic() + timeout
            found = self._read(deadline)
            self._last, self._last_read_at = found, time.monotonic()
            return found

    def snapshot(self, timeout: float = 10.0) -> list[PartitionLag]:
        """The last read while it is younger than the refresh interval, else a new one
        (:meth:`read`, same errors)."""
        with self._lock:
            if self._last is not None and time.monotonic() - self._last_read_at < self._refresh_seconds:
                return self._last
        return self.read(timeout)

    def publish(self, lags: Sequence[PartitionLag]) -> None:
        """Set the lag gauges to ``lags`` and remove the series of partitions it lacks."""
        labels_now = set()
        for lag in lags:
            labels = (lag.group, lag.topic, str(lag.partition))
            labels_now.add(labels)
            CONSUMER_LAG_RECORDS.labels(*labels).set(lag.records)
            CONSUMER_LAG_SECONDS.labels(*labels).set(lag.seconds)
        with self._lock:
            stale, self._published = self._published - labels_now, labels_now
        for labels in stale:
            for gauge in (CONSUMER_LAG_RECORDS, CONSUMER_LAG_SECONDS):
                with contextlib.suppress(KeyError):  # removed already (another monitor in this process)
                    gauge.remove(*labels)

    def refresh(self, timeout: float) -> list[PartitionLag]:
        """:meth:`read` and :meth:`publish` it (same errors; nothing published on an error)."""
        lags = self.read(timeout)
        self.publish(lags)
        return lags

    def close(self) -> None:
        """Close the monitor's consumers; the gauges keep their last values."""
        with self._lock:
            self._offsets.close()
            if self._fetcher is not None:
                self._fetcher.close()
                self._fetcher = None

    def __enter__(self) -> LagMonitor:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- one read ---------------------------------------------------------------------------------

    def _read(self, deadline: float) -> list[PartitionLag]:
        # Every group's offsets first, then every topic's ends once: an end read after the
        # offsets is never below them, and groups on one topic are judged against one end.
        unread: list[str] = []
        committed = {source.group: self._committed(source, deadline, unread) for source in self._sources}
        self.unread_groups = tuple(unread)
        topics = sorted({topic for source in self._sources if committed[source.group] is not None
                         for topic in source.topics})
        looked_at = self._clock()  # before the ends are read: a record past an end was appended after it
        marks = {topic: self._watermarks(topic, deadline) for topic in topics}
        for topic, partitions in marks.items():
            for partition, mark in partitions.items():
                self._note_end(topic, partition, mark.high, looked_at)
        standing: list[tuple[str, str, int, int | None, int, int]] = []  # group, topic, partition, offset, start, end
        for source in self._sources:
            offsets = committed[source.group]
            if offsets is None:
                continue
            for topic in source.topics:
                for partition, mark in sorted(marks[topic].items()):
                    offset = offsets.get((topic, partition))
                    start = mark.low if offset is None else max(offset, mark.low)
                    standing.append((source.group, topic, partition, offset, start, max(mark.high, start)))
        lagging = {(topic, partition, start): end for _, topic, partition, _, start, end in standing if start < end}
        firsts = self._first_records(lagging, deadline)
        now = self._clock()
        found = []
        for group, topic, partition, offset, start, end in standing:
            first = firsts.get((topic, partition, start)) if start < end else _NONE_LEFT
            if first is None:
                found.append(PartitionLag(group, topic, partition, offset, end, end - start, math.nan))
            elif isinstance(first, _NoneLeft):
                found.append(PartitionLag(group, topic, partition, offset, end, 0, 0.0))
            else:
                age = max(0.0, now - first) if not math.isnan(first) else math.inf
                seconds = min(age, now - self._absent_at(topic, partition, start))
                if math.isinf(seconds):  # no timestamp and no read of ours saw the record arrive: unknown
                    seconds = math.nan
                found.append(PartitionLag(group, topic, partition, offset, end, end - start, seconds))
        return sorted(found, key=lambda lag: (lag.group, lag.topic, lag.partition))

    def _watermarks(self, topic: str, deadline: float) -> Mapping[int, Watermarks]:
        """``topic``'s partitions' watermarks; none (nothing reported for it) when the topic does
        not exist, as after a deletion: one missing topic must not take every group's lag with it."""
        try:
            return self._offsets.watermarks(topic, deadline=deadline)
        except UnknownTopicError as e:
            if e.retriable:  # a partition missing from the client's metadata for a while: the read fails
                raise
            logger.warning("lag on %s not read: the topic does not exist", topic)
            return {}

    def _note_end(self, topic: str, partition: int, end: int, at: float) -> None:
        """Remember that ``topic[partition]`` ended at ``end`` at ``at`` (the clock's seconds): the
        last :data:`_ENDS_KEPT` distinct ends, each with the latest time it was seen."""
        seen = self._ends_seen.setdefault((topic, partition), collections.deque(maxlen=_ENDS_KEPT))
        if seen and seen[-1][1] >= end:
            if seen[-1][1] == end:
                seen[-1] = (at, end)
            return
        seen.append((at, end))

    def _absent_at(self, topic: str, partition: int, offset: int) -> float:
        """The latest time a read of this monitor saw ``topic[partition]`` end at or before
        ``offset`` (the record there was appended later: its age is at most now minus that
        time); -inf when no kept read did."""
        for at, end in reversed(self._ends_seen.get((topic, partition), ())):
            if end <= offset:
                return at
        return -math.inf

    def _committed(
        self, source: CommittedSource, deadline: float, unread: list[str]
    ) -> dict[tuple[str, int], int] | None:
        """``{(topic, partition): next offset}`` of ``source``; None when it has none at all
        (not running here) or they could not be read (logged, by the error's class only, and
        the group appended to ``unread``)."""
        try:
            if source.stored is not None:
                found = self._stored(source, deadline)
                if found is None:
                    unread.append(source.group)
                    return None
            else:
                found = {}
                for topic in source.topics:
                    partitions = self._offsets.partitions(topic, deadline=deadline)
                    answer = self._offsets.committed(source.group, topic, partitions, deadline=deadline)
                    found.update({(topic, p): offset for p, offset in answer.items() if offset is not None})
        except Exception as e:  # the store's or the broker's: this group is left out of the read
            logger.warning("lag of group %s not read: its offsets could not be read (%s)", source.group,
                           type(e).__name__)
            unread.append(source.group)
            return None
        return found or None

    def _stored(self, source: CommittedSource, deadline: float) -> dict[tuple[str, int], int] | None:
        """``source.stored``'s offsets, waited for until half the time left before ``deadline``
        (the ends and first records need the rest); None when they did not come by then. The
        store may hang (a connection cut off): the call goes on on a thread of its own, never
        started again for this group while it runs, so it holds one thread and no other group."""
        assert source.stored is not None
        running = self._stored_calls.get(source.group)
        if running is None or running.finished.is_set():
            running = self._stored_calls[source.group] = _DaemonCall(source.stored, source.topics)
        if not running.finished.wait(max(0.0, (deadline - time.monotonic()) / 2)):
            logger.warning("lag of group %s not read: its store did not answer in time", source.group)
            return None
        if running.error is not None:
            raise running.error
        return dict(running.value or {})

    def _first_records(
        self, lagging: Mapping[tuple[str, int, int], int], deadline: float
    ) -> dict[tuple[str, int, int], float | _NoneLeft]:
        """``{(topic, partition, start): timestamp (Unix seconds)}`` of the first record a
        ``read_committed`` reader gets at or after ``start`` and before the key's end, or
        :data:`_NONE_LEFT` when only markers or aborted records are left; missing where the
        deadline came first. Groups at one offset of a partition share its fetch; a partition
        wanted at several offsets is fetched once per offset, in rounds."""
        pending = dict(lagging)
        found: dict[tuple[str, int, int], float | _NoneLeft] = {}
        while pending and time.monotonic() < deadline:
            this_round: dict[tuple[str, int], tuple[int, int]] = {}
            for (topic, partition, start), end in sorted(pending.items()):
                this_round.setdefault((topic, partition), (start, end))
            found.update(self._fetch_round(this_round, deadline))
            for (topic, partition), (start, _) in this_round.items():
                pending.pop((topic, partition, start))
        return found

    def _fetch_round(
        self, wanted: Mapping[tuple[str, int], tuple[int, int]], deadline: float
    ) -> dict[tuple[str, int, int], float | _NoneLeft]:
        """Fetch the first record of each ``(topic, partition): (start, end)`` with one assignment."""
        fetcher = self._fetcher_consumer()
        open_ = dict(wanted)
        found: dict[tuple[str, int, int], float | _NoneLeft] = {}
        assigned = [TopicPartition(topic, partition, start) for (topic, partition), (start, _) in wanted.items()]
        with broker_errors("reading the first unprocessed records"):
            fetcher.assign(assigned)
        try:
            while open_ and time.monotonic() < deadline:
                timeout = max(0.0, min(0.1, deadline - time.monotonic()))
                for message in fetcher.consume(len(open_) * 4, timeout=timeout):
                    key = (message.topic(), message.partition())
                    if key not in open_:
                        continue
                    start, end = open_[key]
                    error, offset = message.error(), message.offset()
                    if error is not None:
                        # The partition's end reached with no record handed out first: only
                        # transaction markers or aborted records were left (no position says
                        # so: a read_committed consumer's position does not pass markers).
                        if error.code() == KafkaError._PARTITION_EOF:
                            found[(*key, start)] = _NONE_LEFT
                            del open_[key]
                        continue
                    if offset is None or offset < start:
                        continue
                    # A timestamp of 0 or less is none (Kafka's -1; a producer may set any): NaN, not 1970.
                    stamp = message.timestamp()[1]
                    found[(*key, start)] = (stamp / 1000.0 if stamp > 0 else math.nan) if offset < end else _NONE_LEFT
                    del open_[key]
                    fetcher.pause([TopicPartition(*key)])
        finally:
            fetcher.resume(assigned)  # a paused partition stays paused through unassign and a later assign
            fetcher.unassign()
        return found

    def _fetcher_consumer(self) -> Consumer:
        if self._fetcher is None:
            self._fetcher = consumer_for(
                self._settings,
                group_id=f"turnlog-lag-{uuid.uuid4()}",  # never subscribes, never commits
                **{"isolation.level": "read_committed", "enable.partition.eof": True,
                   "max.partition.fetch.bytes": _FETCH_BYTES, "fetch.max.bytes": 16 * _FETCH_BYTES,
                   "queued.max.messages.kbytes": 1024},
            )
        return self._fetcher


class _DaemonCall:
    """``call(*args)`` on a daemon thread (a store that never answers must not hold the process's
    exit, as a ``concurrent.futures`` worker would): ``finished`` is set with ``value`` or ``error``."""

    def __init__(self, call: StoredOffsets, *args: Sequence[str]) -> None:
        self.finished = threading.Event()
        self.value: Mapping[tuple[str, int], int] | None = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.value = call(*args)
            except BaseException as e:  # handed to the reader, which leaves the group out
                self.error = e
            finally:
                self.finished.set()

        threading.Thread(target=run, name="turnlog-lag-store", daemon=True).start()


class _NoneLeft:
    """The marker of a partition with no record left before its end (only transaction markers)."""


_NONE_LEFT = _NoneLeft()


def publish_every(monitor: LagMonitor, interval: float, stopping: threading.Event) -> None:
    """Refresh and publish ``monitor``'s lag every ``interval`` seconds until ``stopping`` is set
    (``turnlog lag-exporter``'s loop). A read the broker did not answer is logged and tried
    again at the next interval; the series keep their last values meanwhile."""
    while not stopping.is_set():
        started = time.monotonic()
        try:
            monitor.refresh(timeout=interval)
        except BrokerError as e:
            logger.warning("consumer lag not read: %s", e)
        stopping.wait(max(0.0, interval - (time.monotonic() - started)))
