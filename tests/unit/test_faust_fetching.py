"""The fix of Faust's fetch of paused partitions (``stream_processors/fetching.py``).

The root, shown on the real code: aiokafka's ``Fetcher.fetched_records``
drains every partition when given an empty set, and Faust's real
``Consumer.getmany`` hands the consumer thread its live set of active
partitions, which empties while the thread waits, then drops the records of
partitions that are not active. Only the consumer thread is a stand-in: it
applies aiokafka's rule to a prefetched batch and moves aiokafka's position as
a drain does.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiokafka
import faust
import pytest
from aiokafka.consumer.fetcher import Fetcher, FetchResult
from aiokafka.structs import ConsumerRecord
from faust.transport.consumer import Consumer, ThreadDelegateConsumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP

from turnlog.stream_processors.fetching import SnapshotFetchApp, SnapshotFetchConsumer, records_to_hand_back

ROOT = Path(__file__).resolve().parents[2]
AIOKAFKA_VERSION = "0.14.0"

#: SHA-256 of the upstream sources the fix relies on or replaces.
UPSTREAM_SOURCES = {
    (Consumer, "_wait_next_records"): "6218e1969a636b3ff504ad1b8e7ad58a113572e43d746cc96d684ed5153032c6",
    (Consumer, "getmany"): "4b168d84882a70d6e3e2f9804430a63b92f8fd117d3187cbb4aeb54305bda34e",
    (ThreadDelegateConsumer, "_getmany"): "f9d47aa9010b5ff2b874ba65f927871f3612718d8a9db00b58601554a35236c4",
    (faust.App, "_new_consumer"): "bff6ccd646b71ea99a7e7a7d1c62adbf3d34432a0b42a39e6f60b4c0307d89c8",
    (AIOKafkaConsumerThread, "_fetch_records"): "39a2c6c79fc1455a199629912b533458a720c64983bc957420a42feef6593baa",
    (AIOKafkaConsumerThread, "on_start"): "38b4e8bd1e10723aed02bb1e8c74ccb02a0b04dec35b9001c51f45fa7f2b611c",
    (Fetcher, "_get_actions_per_node"): "1dab2cf937d165d0eeacc8da8ed2b0ebd80b321bb6583757e01cdc1013d31635",
}
EVENTS = TP("events", 0)
CHANGELOG = TP("app-state-changelog", 0)


def _record(tp: TP, offset: int) -> ConsumerRecord:
    return ConsumerRecord(tp.topic, tp.partition, offset, 0, 0, b"k", b"v", None, 1, 1, [])


def test_aiokafka_is_pinned_to_the_version_the_fix_was_written_against() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = [d for d in pyproject["project"]["dependencies"] if d.startswith("aiokafka")]
    assert pins == [f"aiokafka=={AIOKAFKA_VERSION}"]
    assert aiokafka.__version__ == AIOKAFKA_VERSION


@pytest.mark.parametrize("owner,method", sorted(UPSTREAM_SOURCES, key=lambda k: (k[0].__name__, k[1])))
def test_the_upstream_methods_relied_on_are_unchanged(owner: type, method: str) -> None:
    source = inspect.getsource(getattr(owner, method))
    assert hashlib.sha256(source.encode()).hexdigest() == UPSTREAM_SOURCES[(owner, method)], (
        f"{owner.__name__}.{method} changed: re-check stream_processors/fetching.py against it"
    )


def test_aiokafka_drains_every_partition_when_given_none() -> None:
    """The real ``Fetcher.fetched_records``: an empty set of partitions means all of them."""
    state = SimpleNamespace(paused=False, position=100, consumed_to=lambda offset: setattr(state, "position", offset))
    assignment = SimpleNamespace(active=True, state_value=lambda tp: state)
    class Records:  # aiokafka's partition records: iterated, next_fetch_offset follows
        def __init__(self) -> None:
            self.left = [_record(EVENTS, 100), _record(EVENTS, 101)]
            self.next_fetch_offset = 100

        def __iter__(self) -> Records:
            return self

        def __next__(self) -> ConsumerRecord:
            if not self.left:
                raise StopIteration
            record = self.left.pop(0)
            self.next_fetch_offset = record.offset + 1
            return record

    fetcher: Any = SimpleNamespace(
        _subscriptions=SimpleNamespace(reassignment_in_progress=False, is_assigned=lambda tp: True),
        _records={EVENTS: FetchResult(EVENTS, assignment=assignment, partition_records=Records(), backoff=0)},
        _notify=lambda future: None,
        _wait_consume_future=None,
    )
    drained = asyncio.run(Fetcher.fetched_records(fetcher, set(), timeout=0))
    assert [r.offset for r in drained[EVENTS]] == [100, 101]
    assert state.position == 102  # past the records: aiokafka will not fetch them again


class _Thread:
    """Stands in for the consumer thread. While it waits for a fetch, the main
    side pauses ``pause_meanwhile``; then it drains, by aiokafka's rule, the
    records waiting in ``prefetched``, and moves the position past them."""

    def __init__(self, consumer: Any, prefetched: dict[TP, list[int]], pause_meanwhile: set[TP]) -> None:
        self.consumer = consumer
        self.prefetched = prefetched
        self.pause_meanwhile = pause_meanwhile
        self.position = {tp: offsets[0] for tp, offsets in prefetched.items()}
        self.asked: list[frozenset[TP]] = []
        self.seeks: list[dict[TP, int]] = []
        self.assigned = {EVENTS, CHANGELOG}

    async def getmany(self, active_partitions: Any, timeout: float) -> dict[TP, list[ConsumerRecord]]:
        await asyncio.sleep(0)  # the thread waits for a fetch; the main side goes on
        self.consumer.pause_partitions(self.pause_meanwhile)
        self.asked.append(frozenset(active_partitions))
        drained: dict[TP, list[ConsumerRecord]] = {}
        for tp, offsets in self.prefetched.items():
            if active_partitions and tp not in active_partitions:  # aiokafka's rule
                continue
            drained[tp] = [_record(tp, offset) for offset in offsets]
            self.position[tp] = offsets[-1] + 1
        return drained

    async def seek_wait(self, partitions: dict[TP, int]) -> None:
        self.seeks.append(dict(partitions))
        self.position.update(partitions)

    def highwater(self, tp: TP) -> int:
        return 0

    def assignment(self) -> set[TP]:
        return set(self.assigned)


async def _fetch_once(app: faust.App, *, active: set[TP], pause_meanwhile: set[TP]) -> tuple[list[int], _Thread]:
    consumer = app.consumer
    consumer._active_partitions = set(active)
    consumer._paused_partitions = {EVENTS, CHANGELOG} - active
    thread = _Thread(consumer, {EVENTS: [100, 101, 102]}, pause_meanwhile)
    consumer._thread = thread
    delivered = [message.offset async for tp, message in consumer.getmany(timeout=1.0) if tp == EVENTS]
    return delivered, thread


async def test_upstream_drains_a_paused_partition_and_drops_its_records() -> None:
    """The end of a changelog restore: only the changelog is active, the stream
    partition is paused, and the changelog is paused while the thread waits."""
    delivered, thread = await _fetch_once(faust.App("fetch-upstream"), active={CHANGELOG}, pause_meanwhile={CHANGELOG})
    assert thread.asked == [frozenset()]  # the live set, emptied while the thread waited
    assert delivered == []
    assert thread.position[EVENTS] == 103 and thread.seeks == []  # lost: never delivered, never fetched again


async def test_the_snapshot_fetch_never_drains_a_paused_partition() -> None:
    app = SnapshotFetchApp("fetch-snapshot")
    assert isinstance(app.consumer, SnapshotFetchConsumer)
    delivered, thread = await _fetch_once(app, active={CHANGELOG}, pause_meanwhile={CHANGELOG})
    assert thread.asked == [frozenset({CHANGELOG})]
    assert delivered == []
    assert thread.position[EVENTS] == 100  # still to be read


async def test_records_of_a_partition_paused_during_the_fetch_are_handed_back() -> None:
    delivered, thread = await _fetch_once(SnapshotFetchApp("fetch-hand-back"), active={EVENTS}, pause_meanwhile={EVENTS})
    assert delivered == []
    assert thread.seeks == [{EVENTS: 100}]
    assert thread.position[EVENTS] == 100


async def test_records_of_a_partition_revoked_during_the_fetch_are_dropped_not_sought() -> None:
    app = SnapshotFetchApp("fetch-revoked")
    consumer = app.consumer
    consumer._active_partitions = {EVENTS}
    consumer._paused_partitions = set()
    thread = _Thread(consumer, {EVENTS: [100, 101, 102]}, {EVENTS})
    thread.assigned = {CHANGELOG}  # EVENTS went to another worker meanwhile
    consumer._thread = thread
    delivered = [message.offset async for tp, message in consumer.getmany(timeout=1.0) if tp == EVENTS]
    assert delivered == [] and thread.seeks == []


async def test_records_of_active_partitions_are_delivered_in_order() -> None:
    delivered, thread = await _fetch_once(SnapshotFetchApp("fetch-active"), active={EVENTS}, pause_meanwhile=set())
    assert delivered == [100, 101, 102]
    assert thread.seeks == []


def test_records_to_hand_back_names_the_first_offset_of_each_inactive_partition() -> None:
    records = {EVENTS: [_record(EVENTS, 7), _record(EVENTS, 8)], CHANGELOG: [_record(CHANGELOG, 3)]}
    assert records_to_hand_back(records, {CHANGELOG}) == {EVENTS: 7}
    assert records_to_hand_back(records, {EVENTS, CHANGELOG}) == {}
    assert records_to_hand_back({EVENTS: []}, set()) == {}


async def test_the_worker_consumer_reads_committed_records_and_fetches_promptly(tmp_path) -> None:
    from turnlog.settings import TurnlogSettings
    from turnlog.stream_processors.app import make_app
    from turnlog.stream_processors.fetching import PROMPT_FETCH_MAX_WAIT_MS

    app = make_app(TurnlogSettings(faust_data_dir=str(tmp_path)), "unit-fetch")
    worker_consumer = app.consumer._thread._create_worker_consumer(app.transport)
    try:
        assert worker_consumer._isolation_level == "read_committed"
        assert worker_consumer._fetch_max_wait_ms == PROMPT_FETCH_MAX_WAIT_MS  # until the fetcher is swapped
    finally:
        await worker_consumer.stop()


def _fetcher(undrained: set[TP]) -> Any:
    """A :class:`PromptFetcher` holding what upstream's ``_get_actions_per_node`` reads: one broker
    (node 0) leads every partition, nothing in flight, ``undrained`` prefetched and not drained."""
    from turnlog.stream_processors.fetching import PromptFetcher

    fetcher = PromptFetcher.__new__(PromptFetcher)
    fetcher._records = {tp: SimpleNamespace(calculate_backoff=lambda: 0) for tp in undrained}
    fetcher._in_flight = set()
    fetcher._preferred_read_replica = {}
    fetcher._client = SimpleNamespace(cluster=SimpleNamespace(leader_for_partition=lambda tp: 0))
    fetcher._max_partition_fetch_bytes = 1 << 20
    fetcher._fetch_min_bytes = 1
    fetcher._fetch_max_bytes = 50 << 20
    fetcher._isolation_level = 1
    fetcher._client_rack = None
    fetcher._fetcher_timeout = 0.2
    fetcher._fetch_max_wait_ms = 0
    return fetcher


def _assignment(*tps: TP) -> Any:
    state = SimpleNamespace(has_valid_position=True, paused=False, position=7)
    return SimpleNamespace(tps=list(tps), state_value=lambda tp: state)


def test_a_fetch_that_leaves_out_an_undrained_partition_waits_briefly_at_the_broker() -> None:
    # A fetch of only partitions that get no records (the assignor's leader topic) is held for the
    # whole wait while the stream's partitions cannot be fetched: Faust's 1,500 ms stalled the
    # sequencer's input ~1.4 s out of every ~1.75 s under load.
    from turnlog.stream_processors.fetching import PROMPT_FETCH_MAX_WAIT_MS

    leader = TP("app-__assignor-__leader", 0)
    requests, *_ = _fetcher(undrained={EVENTS})._get_actions_per_node(_assignment(EVENTS, leader))
    [(node, request)] = requests
    assert (node, request.topics) == (0, [(leader.topic, [(0, 7, 1 << 20)])])
    assert request._max_wait_ms == PROMPT_FETCH_MAX_WAIT_MS <= 100


def test_a_fetch_of_every_partition_waits_long_so_an_idle_consumer_does_not_spin() -> None:
    from turnlog.stream_processors.fetching import IDLE_FETCH_MAX_WAIT_MS

    leader = TP("app-__assignor-__leader", 0)
    requests, *_ = _fetcher(undrained=set())._get_actions_per_node(_assignment(EVENTS, leader))
    [(_, request)] = requests
    assert sorted(topic for topic, _ in request.topics) == sorted([EVENTS.topic, leader.topic])
    assert request._max_wait_ms == IDLE_FETCH_MAX_WAIT_MS >= 1000
