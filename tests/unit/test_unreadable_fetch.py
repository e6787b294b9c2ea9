"""A record whose header name is not UTF-8, where each reader meets it.

- The sequencer's fetch (``stream_processors/fetching.py``): the real aiokafka
  ``Fetcher.fetched_records``, ``FetchResult`` and ``PartitionRecords`` unpack real
  record batches (the C extension's and the pure-Python build's); only the fetch
  routine (what puts the batches there) and the confluent-kafka scanner are stand-ins.
  Upstream's consumer thread raises and loses the records of another partition drained
  in the same pass; :class:`UnreadableSafeConsumerThread` hands on the readable records,
  the unreadable one marked, moves past it, and hands back what the pass drained.
- The headers as confluent-kafka gives them (:func:`read_headers`).
- The sequencer dead-letters such a record with its reason, from the stream or read again.
- The replay skips and counts it.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import inspect
from collections.abc import Iterator
from typing import Any

import aiokafka.record.memory_records as memory_records
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.fetcher import READ_UNCOMMITTED, Fetcher, FetchResult, PartitionRecords
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import _DefaultRecordBatchPy
from aiokafka.structs import ConsumerRecord, TopicPartition
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as FaustAIOKafkaConsumer

from turnlog import kafka, metrics
from turnlog.kafka.record_headers import NOT_UTF8_NAME, UnreadableHeaders, read_headers
from turnlog.ops import replay
from turnlog.schemas import encode_event
from turnlog.settings import TopicNames, TurnlogSettings
from turnlog.stream_processors.app import make_app
from turnlog.stream_processors.fetching import SnapshotFetchApp, UnreadableSafeConsumerThread
from turnlog.stream_processors.sequencer import Sequencer, SourceRecord
from turnlog.stream_processors.unreadable_records import PartitionScanner

from tests.support import EventFactory
from tests.unreadable_headers import record_batch, unreadable_header

#: SHA-256 of the upstream sources the fetch fix relies on (the pass it undoes) or replaces.
UPSTREAM_SOURCES = {
    (Fetcher, "fetched_records"): "be4348896b9b66afe048de954e2be91c546f4e96c94cb120d5764ec77ce8f19e",
    (Fetcher, "_create_fetch_waiter"): "61d840568746477e0792665e11a1217f16d2595fe31f20e6282162677650ceca",
    (Fetcher, "seek_to"): "f0ba6aba6c22ef83e0d58690ef771d04777032ec48cbfa68325c67bf0ef508f4",
    (FetchResult, "getall"): "3e717e30de5068d549dd41b231928c67a24e832a928d48bac5f485e448daa903",
    (FetchResult, "check_assignment"): "b5340df67e3f330f998e01e49adc7fd03dae24b8a0e201ae4325d3f980d3eae3",
    (PartitionRecords, "_unpack_records"): "b803e6d46480732c7a7faa8e784b338bcdd4e707ea67fba96c013654b04b8a08",
    (AIOKafkaConsumerThread, "_fetch_records"): "39a2c6c79fc1455a199629912b533458a720c64983bc957420a42feef6593baa",
    (FaustAIOKafkaConsumer, "_new_consumer_thread"): "0870ec53dea75083995e3565c0f0a25a1c63ecceaeb238e92e2585e3623af5a9",
    (AIOKafkaConsumer, "seek"): "a9430f1f3b9ac4194dfccc7b61d3aa32f89ed3d1b065e78c72eec34380e4f9ca",
}
HEALTHY = TopicPartition("t.events", 0)
POISONED = TopicPartition("t.events", 1)
TOPICS = TopicNames("t")


@pytest.mark.parametrize("owner,method", sorted(UPSTREAM_SOURCES, key=lambda k: (k[0].__name__, k[1])))
def test_the_upstream_methods_relied_on_are_unchanged(owner: type, method: str) -> None:
    source = inspect.getsource(getattr(owner, method))
    assert hashlib.sha256(source.encode()).hexdigest() == UPSTREAM_SOURCES[(owner, method)], (
        f"{owner.__name__}.{method} changed: re-check stream_processors/fetching.py against it"
    )


# --- the fetch ---------------------------------------------------------------------------------


class _Fetcher:
    """aiokafka's ``Fetcher`` without its fetch routine: the real draining, waiting and seeking
    methods over the real subscription state; :meth:`fetched` stands for a fetch response."""

    fetched_records = Fetcher.fetched_records
    _create_fetch_waiter = Fetcher._create_fetch_waiter
    _notify = Fetcher._notify
    seek_to = Fetcher.seek_to

    def __init__(self, subscriptions: SubscriptionState, pure_python: bool) -> None:
        self._subscriptions = subscriptions
        self._records: collections.OrderedDict[TopicPartition, Any] = collections.OrderedDict()
        self._fetch_waiters: set[asyncio.Future[None]] = set()
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self._wait_consume_future = None
        self._max_partition_fetch_bytes = 1 << 20
        self._isolation_level = READ_UNCOMMITTED
        self._memory_records = memory_records._MemoryRecordsPy if pure_python else memory_records.MemoryRecords

    def fetched(self, tp: TopicPartition, first: int, records: list[tuple[bytes | None, bytes, list[Any]]]) -> None:
        """A fetch response for ``tp`` from offset ``first``, as the fetch routine stores it."""
        partition_records = PartitionRecords(
            tp, self._memory_records(record_batch(first, records)), [], first, None, None, True, READ_UNCOMMITTED
        )
        self._records[tp] = FetchResult(
            tp, assignment=self._subscriptions.subscription.assignment, partition_records=partition_records, backoff=0
        )

    def position(self, tp: TopicPartition) -> int:
        return int(self._subscriptions.subscription.assignment.state_value(tp).position)


class _Consumer:
    """aiokafka's consumer as the consumer thread uses it: its fetcher, and its real ``seek``."""

    seek = AIOKafkaConsumer.seek

    def __init__(self, fetcher: _Fetcher) -> None:
        self._fetcher = fetcher
        self._closed = False


class _Scanner:
    """Stands for the confluent-kafka ``PartitionScanner``: reads ``log`` by its rules."""

    def __init__(self, log: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> None:
        self.log = log
        self.scans: list[tuple[str, int, int]] = []
        self.error: Exception | None = None

    def scan(self, topic: str, partition: int, first: int, *, max_records: int, max_bytes: int,
             read_committed: bool) -> list[ConsumerRecord[bytes, bytes]]:
        self.scans.append((topic, partition, first))
        if self.error is not None:
            raise self.error
        found: list[ConsumerRecord[bytes, bytes]] = []
        for record in self.log.get(TopicPartition(topic, partition), []):
            if record.offset >= first:
                found.append(record)
                if isinstance(record.headers, UnreadableHeaders) or len(found) >= max_records:
                    break
        return found


def _record(tp: TopicPartition, offset: int, key: bytes, value: bytes, headers: Any = ()) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(tp.topic, tp.partition, offset, 1_700_000_000_000, 0, key, value, None, len(key), len(value),
                          headers)


HEALTHY_RECORDS = [(b"h", b"h0", []), (b"h", b"h1", []), (b"h", b"h2", [])]
#: offsets 10..13 of the poisoned partition: two readable records, the unreadable one, one more
POISONED_RECORDS = [(b"a", b"p10", []), (b"a", b"p11", [("n", b"v")]), (b"x", b"p12", [unreadable_header()]),
                    (b"a", b"p13", [])]
SCANNED = [
    _record(POISONED, 10, b"a", b"p10"),
    _record(POISONED, 11, b"a", b"p11", (("n", b"v"),)),
    _record(POISONED, 12, b"x", b"p12", UnreadableHeaders(NOT_UTF8_NAME)),
    _record(POISONED, 13, b"a", b"p13"),
]


@pytest.fixture(params=["C extension", "pure Python"])
def pure_python(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    """Both aiokafka builds' record batches: the C extension's raises UnicodeDecodeError, the
    pure-Python one CorruptRecordException."""
    pure = request.param == "pure Python"
    if pure:
        monkeypatch.setattr(memory_records, "DefaultRecordBatch", _DefaultRecordBatchPy)
    yield pure


async def _setup(pure_python: bool) -> tuple[_Fetcher, _Consumer, Any, _Scanner]:
    subscriptions = SubscriptionState()
    subscriptions.assign_from_user({HEALTHY, POISONED})
    subscriptions.seek(HEALTHY, 0)
    subscriptions.seek(POISONED, 10)
    fetcher = _Fetcher(subscriptions, pure_python)
    fetcher.fetched(HEALTHY, 0, HEALTHY_RECORDS)  # drained first in the pass, then the poisoned partition fails
    fetcher.fetched(POISONED, 10, POISONED_RECORDS)
    app = SnapshotFetchApp(f"unreadable-{pure_python}")
    scanner = _Scanner({POISONED: SCANNED})
    app.partition_scanner = scanner  # type: ignore[attr-defined]
    return fetcher, _Consumer(fetcher), app.consumer._thread, scanner


def _offsets(records: dict[Any, list[ConsumerRecord[bytes, bytes]]]) -> dict[Any, list[int]]:
    return {tp: [r.offset for r in batch] for tp, batch in records.items()}


async def test_every_turnlog_faust_worker_fetches_through_the_fix(tmp_path) -> None:
    app = make_app(TurnlogSettings(faust_data_dir=str(tmp_path)), "unreadable-wiring")
    assert isinstance(app.partition_scanner, PartitionScanner)  # type: ignore[attr-defined]
    assert isinstance(app.consumer._thread, UnreadableSafeConsumerThread)


async def test_upstream_raises_every_time_and_loses_the_records_drained_before_in_the_pass(pure_python: bool) -> None:
    fetcher, consumer, thread, _ = await _setup(pure_python)
    expected = CorruptRecordException if pure_python else UnicodeDecodeError
    with pytest.raises(expected):
        await AIOKafkaConsumerThread._fetch_records(thread, consumer, {HEALTHY, POISONED}, timeout=0)
    assert fetcher.position(HEALTHY) == 3  # drained, never returned: lost
    assert fetcher.position(POISONED) == 10  # stuck: the same fetch again and again
    fetcher.fetched(POISONED, 10, POISONED_RECORDS)
    with pytest.raises(expected):
        await AIOKafkaConsumerThread._fetch_records(thread, consumer, {HEALTHY, POISONED}, timeout=0)
    assert fetcher.position(POISONED) == 10


async def test_the_fetch_hands_on_the_readable_records_and_the_unreadable_one_and_moves_past_it(
    pure_python: bool,
) -> None:
    fetcher, consumer, thread, scanner = await _setup(pure_python)
    counted = metrics.UNREADABLE_RECORDS.labels(POISONED.topic)._value.get()
    got = await thread._fetch_records(consumer, {HEALTHY, POISONED}, timeout=0)
    assert _offsets(got) == {POISONED: [10, 11, 12]}
    assert [r.value for r in got[POISONED]] == [b"p10", b"p11", b"p12"]
    assert got[POISONED][1].headers == (("n", b"v"),)
    unreadable = got[POISONED][2].headers
    assert isinstance(unreadable, UnreadableHeaders) and unreadable.reason == NOT_UTF8_NAME
    assert scanner.scans == [(POISONED.topic, POISONED.partition, 10)]  # read from aiokafka's position
    assert fetcher.position(POISONED) == 13  # past the unreadable record
    assert fetcher.position(HEALTHY) == 0  # handed back: the pass drained it, nothing returned it
    assert not fetcher._records  # both half-drained fetches dropped
    assert metrics.UNREADABLE_RECORDS.labels(POISONED.topic)._value.get() == counted + 1
    # aiokafka fetches again from the positions: nothing is lost, nothing repeated.
    fetcher.fetched(HEALTHY, 0, HEALTHY_RECORDS)
    fetcher.fetched(POISONED, 13, POISONED_RECORDS[3:])
    got = await thread._fetch_records(consumer, {HEALTHY, POISONED}, timeout=0)
    assert _offsets(got) == {HEALTHY: [0, 1, 2], POISONED: [13]}


async def test_the_fetch_waits_for_records_as_upstream_does(pure_python: bool) -> None:
    fetcher, consumer, thread, _ = await _setup(pure_python)
    fetcher._records.clear()

    async def respond() -> None:
        await asyncio.sleep(0)
        fetcher.fetched(HEALTHY, 0, HEALTHY_RECORDS)
        for waiter in list(fetcher._fetch_waiters):
            waiter.set_result(None)  # what the fetch routine does when records arrive

    responding = asyncio.create_task(respond())
    got = await thread._fetch_records(consumer, {HEALTHY, POISONED}, timeout=10)
    await responding
    assert _offsets(got) == {HEALTHY: [0, 1, 2]}
    assert await thread._fetch_records(consumer, {HEALTHY, POISONED}, timeout=0.01) == {}


async def test_a_fetch_of_at_most_max_records_meets_the_unreadable_record_in_a_later_pass(pure_python: bool) -> None:
    fetcher, consumer, thread, scanner = await _setup(pure_python)
    del fetcher._records[HEALTHY]
    got = await thread._fetch_records(consumer, {HEALTHY, POISONED}, timeout=0, max_records=2)
    assert _offsets(got) == {POISONED: [10, 11]} and scanner.scans == []  # aiokafka stopped before the poison
    got = await thread._fetch_records(consumer, {HEALTHY, POISONED}, timeout=0, max_records=2)
    assert _offsets(got) == {POISONED: [12]} and isinstance(got[POISONED][0].headers, UnreadableHeaders)
    assert scanner.scans == [(POISONED.topic, POISONED.partition, 12)]
    assert fetcher.position(POISONED) == 13


async def test_a_failure_with_nothing_readable_at_the_position_is_raised(pure_python: bool) -> None:
    fetcher, consumer, thread, scanner = await _setup(pure_python)
    scanner.log = {}  # confluent-kafka reads nothing there: not one record's failure
    with pytest.raises(CorruptRecordException if pure_python else UnicodeDecodeError):
        await thread._fetch_records(consumer, {HEALTHY, POISONED}, timeout=0)
    assert fetcher.position(HEALTHY) == 0 and fetcher.position(POISONED) == 10


async def test_without_a_scanner_the_failure_is_raised_as_upstream(pure_python: bool) -> None:
    fetcher, consumer, thread, _ = await _setup(pure_python)
    thread.app.partition_scanner = None
    with pytest.raises(CorruptRecordException if pure_python else UnicodeDecodeError):
        await thread._fetch_records(consumer, {HEALTHY, POISONED}, timeout=0)


async def test_a_scan_the_broker_does_not_answer_returns_nothing_and_leaves_the_positions(pure_python: bool) -> None:
    fetcher, consumer, thread, scanner = await _setup(pure_python)
    scanner.error = kafka.BrokerUnavailableError("away", retriable=True)
    assert await thread._fetch_records(consumer, {HEALTHY, POISONED}, timeout=0) == {}
    assert fetcher.position(HEALTHY) == 0 and fetcher.position(POISONED) == 10  # the next fetch tries again


async def test_records_scanned_for_a_partition_sought_meanwhile_are_not_handed_on(pure_python: bool) -> None:
    fetcher, consumer, thread, scanner = await _setup(pure_python)
    scan = scanner.scan

    def scan_while_sought(*args: Any, **kwargs: Any) -> list[ConsumerRecord[bytes, bytes]]:
        fetcher._subscriptions.seek(POISONED, 5)  # a rebalance's seek while confluent-kafka reads
        return scan(*args, **kwargs)

    scanner.scan = scan_while_sought  # type: ignore[method-assign]
    assert await thread._fetch_records(consumer, {HEALTHY, POISONED}, timeout=0) == {}
    assert fetcher.position(POISONED) == 5


# --- the headers as confluent-kafka gives them --------------------------------------------------


class _Message:
    """A confluent-kafka ``Message`` whose ``headers()`` fails as the real one does for a name
    that is not UTF-8 (a SystemError set while a UnicodeDecodeError is handled)."""

    def __init__(self, name: bytes | None, other: Exception | None = None) -> None:
        self._name = name
        self._other = other

    def headers(self) -> list[tuple[str, bytes]] | None:
        if self._other is not None:
            raise self._other
        if self._name is None:
            return None
        try:
            return [(self._name.decode("utf-8"), b"v")]
        except UnicodeDecodeError:
            raise SystemError("<method 'headers'> returned a result with an exception set") from None


def test_read_headers_gives_the_headers_or_why_they_cannot_be_read() -> None:
    assert read_headers(_Message(b"name")) == [("name", b"v")]
    assert read_headers(_Message(None)) is None
    unreadable = read_headers(_Message(b"\xff\xfe"))
    assert isinstance(unreadable, UnreadableHeaders) and unreadable.reason == NOT_UTF8_NAME
    assert list(unreadable) == [] and dict(unreadable) == {}  # no headers to whoever iterates them
    other = read_headers(_Message(b"name", MemoryError()))
    assert isinstance(other, UnreadableHeaders) and other.reason == "its headers cannot be decoded (MemoryError)"


# --- the sequencer ------------------------------------------------------------------------------


class _Batch:
    def __init__(self, sent: list[tuple[str, bytes | None, bytes, int, Any]]) -> None:
        self._sent = sent
        self._pending: list[tuple[str, bytes | None, bytes, int, Any]] = []

    def send(self, topic: str, *, key: bytes | None, value: bytes, partition: int, headers: Any = None,
             token: Any = None) -> None:
        self._pending.append((topic, key, value, partition, headers))

    async def delivered(self) -> list[Any]:
        self._sent.extend(self._pending)
        return []


class _Emissions:
    atomic = False

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes, int, Any]] = []

    def batch(self) -> _Batch:
        return _Batch(self.sent)


class _Log:
    def __init__(self, records: list[SourceRecord]) -> None:
        self.records = records

    def committed(self, partition: int) -> int:
        return 0

    def read(self, partition: int, first: int, last: int, key: bytes | None = None) -> list[Any]:
        return [(r.offset, r.key, r.value, r.headers) for r in self.records
                if first <= r.offset <= last and key in (None, r.key)]


def _events_with_an_unreadable_record() -> tuple[EventFactory, list[SourceRecord]]:
    f, intruder = EventFactory(), EventFactory()
    return f, [
        SourceRecord(f.session_id.encode(), encode_event(f.started()), 0, 0),
        # a valid event: in open mode nothing else would refuse it
        SourceRecord(intruder.session_id.encode(), encode_event(intruder.started()), 0, 1,
                     UnreadableHeaders(NOT_UTF8_NAME)),
        SourceRecord(f.session_id.encode(), encode_event(f.completed(1, 0, "hello")), 0, 2),
    ]


@pytest.mark.parametrize("path", ["stream", "read again"])
async def test_the_sequencer_dead_letters_an_unreadable_record_with_its_reason(path: str) -> None:
    f, records = _events_with_an_unreadable_record()
    emissions = _Emissions()
    sequencer = Sequencer(states={}, changelog="t-changelog", emissions=emissions, reader=_Log(records),  # type: ignore[arg-type]
                          topics=TOPICS, max_buffer=8)
    if path == "stream":
        await sequencer.process(records)
    else:  # offset 1 never delivered: the offset tripwire reads it again through the log reader
        await sequencer.process([records[0]])
        await sequencer.process([records[2]])
    dlq = [(key, value, dict(headers)) for topic, key, value, _, headers in emissions.sent if topic == TOPICS.dlq]
    assert dlq == [(records[1].key, records[1].value, {
        "turnlog-reason": b"unreadable: a header name is not UTF-8",
        "turnlog-source-topic": TOPICS.events.encode(),
        "turnlog-source-partition": b"0",
        "turnlog-source-offset": b"1",
    })]
    transcript = [key for topic, key, *_ in emissions.sent if topic == TOPICS.transcript]
    assert transcript == [f.session_id.encode()] * 2  # the healthy session's seqs 0 and 1


# --- the replay ---------------------------------------------------------------------------------


class _ReplayRecord(_Message):
    def __init__(self, value: bytes, key: bytes, offset: int, name: bytes) -> None:
        super().__init__(name)
        self._value, self._key, self._offset = value, key, offset

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes:
        return self._key

    def topic(self) -> str:
        return TOPICS.events

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


class _NoVerifier:
    def verify(self, *args: Any) -> Any:
        raise AssertionError("an unreadable record is refused before it is authenticated")


@pytest.mark.parametrize("verifier", [None, _NoVerifier()], ids=["open mode", "fleet keys"])
def test_the_replay_skips_and_counts_an_unreadable_record(verifier: Any) -> None:
    f = EventFactory()
    record = _ReplayRecord(encode_event(f.started()), f.session_id.encode(), 7, b"\xff\xfe")
    result = replay.ReplayResult()
    emitted: list[Any] = []
    replay._sequence_record(None, record, {}, set(), emitted, result, max_buffer=8, verifier=verifier)  # type: ignore[arg-type]
    assert result.rejected == 1 and result.rejected_reasons == {"unreadable": 1} and emitted == []
