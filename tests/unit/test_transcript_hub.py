"""The transcript hub and its followers, without a broker: finding the topic's partitions
(a stub lookup), skipping a record that fails (a stub consumer), and the subscriber queue's
bounds with the cut-off of a follower that falls behind (a stub hub and store)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from prometheus_client import REGISTRY

from turnlog import follow, kafka
from turnlog.follow import FollowerFellBehind, Subscription, TranscriptHub, follow_session
from turnlog.schemas import encode_event
from turnlog.settings import TurnlogSettings
from turnlog.sinks.reads import EventPage, StoredEvent

from tests.support import EventFactory


class Partitions:
    """``partitions(topic)`` failing with each of ``errors`` in turn, then answering."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def partitions(self, topic: str) -> list[int]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return [0, 1, 2]


def test_the_partitions_are_looked_up_again_while_the_topic_is_missing_or_the_broker_fails(monkeypatch, caplog):
    monkeypatch.setattr(follow, "TOPIC_RETRY_SECONDS", 0.01)
    lookups = Partitions(kafka.UnknownTopicError("no topic t.transcript"), kafka.BrokerUnavailableError("broker away", retriable=True))
    hub = TranscriptHub(TurnlogSettings())
    assert hub._partitions(lookups, "t.transcript") == [0, 1, 2]
    assert lookups.calls == 3
    assert "does not exist (yet)" in caplog.text and "broker away" in caplog.text


def test_a_stop_ends_the_wait_for_the_topic(monkeypatch):
    monkeypatch.setattr(follow, "TOPIC_RETRY_SECONDS", 60.0)
    lookups = Partitions(*[kafka.UnknownTopicError("no topic")] * 100)
    hub = TranscriptHub(TurnlogSettings())
    threading.Timer(0.1, hub._stopping.set).start()
    began = time.monotonic()
    assert hub._partitions(lookups, "t.transcript") is None
    assert time.monotonic() - began < 10 and lookups.calls == 1  # no lookup after the stop


def test_an_error_that_is_not_the_broker_s_is_not_retried():
    lookups = Partitions(ValueError("a bug"))
    hub = TranscriptHub(TurnlogSettings())
    with pytest.raises(ValueError, match="a bug"):
        hub._partitions(lookups, "t.transcript")
    assert lookups.calls == 1


# -- one bad record never stops the hub ------------------------------------------------------
class Record:
    """A consumed record as confluent_kafka gives it (what the hub reads of one)."""

    def __init__(self, key: bytes | None, value: bytes | None, offset: int = 41) -> None:
        self._key, self._value, self._offset = key, value, offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def topic(self) -> str:
        return "t.transcript"

    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None


def skipped(reason: str) -> float:
    return REGISTRY.get_sample_value("turnlog_live_records_skipped_total", {"reason": reason}) or 0.0


async def test_a_record_that_fails_to_decode_or_dispatch_is_skipped_counted_and_named_by_position(monkeypatch, caplog):
    hub = TranscriptHub(TurnlogSettings())
    hub._loop = asyncio.get_running_loop()
    subscription = hub.subscribe("s-1")
    before_invalid, before_error = skipped("invalid"), skipped("error")

    hub._handle(Record(b"s-1", b'{"type": "turn.partial", "secret words": 1}', offset=41))  # not an event
    hub._handle(Record(b"s-1", b"\xff\xfe not even utf-8 secret words", offset=42))

    def broken(value: bytes) -> object:
        raise RuntimeError("decoder bug quoting secret words")

    monkeypatch.setattr(follow, "decode_event", broken)
    hub._handle(Record(b"s-1", b"{}", offset=43))

    assert skipped("invalid") == before_invalid + 2 and skipped("error") == before_error + 1
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [w.split(" offset ")[1].split(" ")[0] for w in warnings] == ["41", "42", "43"]
    assert all("t.transcript[2]" in w for w in warnings)
    assert "secret" not in caplog.text
    assert await subscription.next(0.01) is None  # nothing was handed out


async def test_the_hub_thread_goes_on_after_a_record_that_fails(monkeypatch):
    """The consume loop itself, with a stub consumer: a failing record, then a good one."""
    good = encode_event(EventFactory("s-1").started())
    records = [Record(b"s-1", b"garbage", offset=1), Record(b"s-1", good, offset=2)]

    class Consumer:
        def poll(self, timeout: float):
            return records.pop(0) if records else None

        def assign(self, partitions) -> None:
            pass

        def close(self) -> None:
            pass

    class Offsets:
        def partitions(self, topic: str) -> list[int]:
            return [0]

        def close(self) -> None:
            pass

    monkeypatch.setattr(follow.kafka, "consumer", lambda *a, **k: Consumer())
    monkeypatch.setattr(follow.kafka, "OffsetReader", lambda settings: Offsets())
    hub = TranscriptHub(TurnlogSettings())
    hub._loop = asyncio.get_running_loop()
    subscription = hub.subscribe("s-1")
    hub.start()
    try:
        delivered = await subscription.next(10)
    finally:
        await asyncio.to_thread(hub.stop)
    assert delivered is not None and delivered.seq == 0 and delivered.type == "session.started"


# -- the subscriber queue's bounds, and cutting off a follower that falls behind ------------------
def live(seq: int, size: int = 100) -> StoredEvent:
    return StoredEvent(seq, "turn.partial", "x" * size)


async def test_a_subscription_is_bounded_in_bytes_and_reports_the_overflow_once():
    subscription = Subscription("s", max_bytes=1000)
    for seq in range(9):
        subscription.offer(live(seq))  # 900 bytes
    assert not subscription.overflowed
    subscription.offer(live(9, 200))  # past 1000: dropped
    assert subscription.overflowed
    subscription.offer(live(10, 1))  # after an overflow nothing more is taken until it is reported
    assert await subscription.next(0.01) is None and not subscription.overflowed  # reported: read the store
    subscription.offer(live(11, 1000))
    assert (await subscription.next(0.01)).seq == 11  # the budget is free again
    subscription.offer(live(12, 1001))  # one event larger than the whole budget
    assert subscription.overflowed


class Hub:
    """The hub's subscriber side, fed by the test."""

    def __init__(self) -> None:
        self.subscriptions: list[Subscription] = []

    def subscribe(self, session_id: str, *, max_bytes: int) -> Subscription:
        self.subscriptions.append(Subscription(session_id, max_bytes=max_bytes))
        return self.subscriptions[-1]

    def unsubscribe(self, subscription: Subscription) -> None:
        self.subscriptions.remove(subscription)


async def until(condition, what: str, timeout: float = 10) -> None:
    """Poll ``condition`` on the event loop (other tasks run meanwhile) up to ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def fetch_of(visible: list[StoredEvent], calls: list[int]):
    async def fetch(session_id: str, after_seq: int) -> EventPage:
        calls.append(after_seq)
        return EventPage([e for e in visible if e.seq > after_seq], False)

    return fetch


async def test_a_follower_that_does_not_keep_up_with_the_live_tail_is_cut_off_after_its_last_event():
    hub = Hub()
    follower = follow_session(fetch_of([live(0)], []), hub, "s", -1, poll_seconds=5, queue_bytes=1000,
                              cut_off_when_behind=True)
    assert (await anext(follower)).seq == 0  # from the store
    [subscription] = hub.subscriptions
    subscription.offer(live(1))
    assert (await anext(follower)).seq == 1  # live
    for seq in range(2, 30):  # the consumer is away meanwhile: 2.8 KB for a 1 KB queue
        subscription.offer(live(seq))
    with pytest.raises(FollowerFellBehind) as behind:
        await anext(follower)
    assert (behind.value.session_id, behind.value.last_seq) == ("s", 1)
    assert hub.subscriptions == []  # unsubscribed on the way out


async def test_without_the_cut_off_an_overflowing_follower_reads_the_store_instead():
    hub, stored, calls = Hub(), [live(seq) for seq in range(30)], []
    visible = stored[:1]
    follower = follow_session(fetch_of(visible, calls), hub, "s", -1, poll_seconds=5, queue_bytes=1000)
    assert (await anext(follower)).seq == 0
    [subscription] = hub.subscriptions
    subscription.offer(live(1))
    assert (await anext(follower)).seq == 1
    for event in stored[2:]:  # 2.8 KB for a 1 KB queue
        subscription.offer(event)
    visible[:] = stored  # the sink stored them
    assert [(await anext(follower)).seq for _ in range(28)] == list(range(2, 30))
    assert calls[-1] == 1  # read from the store, after the last event it had


async def test_an_overflow_while_reading_the_store_only_sends_the_follower_back_to_the_store():
    hub, stored, calls = Hub(), [live(seq) for seq in range(31)], []
    visible = stored[:1]
    follower = follow_session(fetch_of(visible, calls), hub, "s", -1, poll_seconds=5, queue_bytes=1000,
                              cut_off_when_behind=True)
    assert (await anext(follower)).seq == 0  # from the store; subscribed since the start
    [subscription] = hub.subscriptions
    for event in stored[1:30]:  # arrives while it is still on the store: 2.9 KB for a 1 KB queue
        subscription.offer(event)
    visible[:] = stored[:30]  # the sink stored them too
    assert [(await anext(follower)).seq for _ in range(29)] == list(range(1, 30))
    nxt = asyncio.ensure_future(anext(follower))  # on to the live tail, where the overflow is reported
    await until(lambda: not subscription.overflowed, "the overflow reported to the follower")
    subscription.offer(stored[30])
    assert (await asyncio.wait_for(nxt, 10)).seq == 30  # live, and not cut off
    await follower.aclose()
