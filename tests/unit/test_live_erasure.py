"""Forgotten sessions in the live path, without a broker or a database: the transcript hub
learns an erasure from the ledger topic (a stub record) or from the store (a stub lookup),
ends its subscribers and hands out nothing more of the session; followers end with
SessionErased; the API's audit id of a token."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import threading
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from turnlog import follow
from turnlog.api.auth import TOKEN_ID_HEX_DIGITS, TokenTable
from turnlog.crypto.ledger_signatures import LedgerSigner, new_issuer_key
from turnlog.follow import SessionErased, Subscription, TranscriptHub, follow_session, store_fetch
from turnlog.schemas import encode_event
from turnlog.schemas.erasure import Erasure, encode_erasure
from turnlog.settings import TurnlogSettings
from turnlog.sinks.reads import EventPage, StoredEvent

from tests.support import EventFactory

SETTINGS = TurnlogSettings(topic_prefix="t")


class Record:
    """A consumed record as confluent_kafka gives it."""

    def __init__(self, topic: str, key: bytes | None, value: bytes | None, offset: int = 7,
                 headers: list[tuple[str, bytes]] | None = None) -> None:
        self._topic, self._key, self._value, self._offset = topic, key, value, offset
        self._headers = headers

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def topic(self) -> str:
        return self._topic

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None


def ledger_record(session_id: str, signer: LedgerSigner | None = None, requested_by: str = "api:abc") -> Record:
    erasure = Erasure(session_id=session_id, fleet="f", requested_by=requested_by,
                      requested_at=dt.datetime.now(dt.UTC))
    key, value = session_id.encode(), encode_erasure(erasure)
    return Record("t.erasures", key, value, headers=signer.headers(key, value) if signer is not None else None)


def transcript_record(session_id: str, seq: int = 0) -> Record:
    return Record("t.transcript", session_id.encode(), encode_event(EventFactory(session_id).started()), seq)


def erased_skipped() -> float:
    return REGISTRY.get_sample_value("turnlog_erased_records_skipped_total", {"component": "live"}) or 0.0


async def settle() -> None:
    """Let the callbacks the hub scheduled on this loop run."""
    for _ in range(3):
        await asyncio.sleep(0)


def live(seq: int) -> StoredEvent:
    return StoredEvent(seq, "turn.partial", "x" * 10)


async def test_a_ledger_record_ends_the_session_s_subscribers_and_its_records_are_dropped_unread(monkeypatch):
    hub = TranscriptHub(SETTINGS)
    hub._loop = asyncio.get_running_loop()
    forgotten, waiting, kept = hub.subscribe("s-gone"), hub.subscribe("s-gone"), hub.subscribe("s-kept")
    hub._dispatch(b"s-gone", encode_event(EventFactory("s-gone").started()))
    await settle()
    assert (await waiting.next(1)) is not None  # handed out before the erasure
    reader = asyncio.ensure_future(waiting.next(30))
    await settle()

    hub._handle_erasure(ledger_record("s-gone"))
    await settle()
    assert forgotten.erased and waiting.erased and not kept.erased
    assert await asyncio.wait_for(reader, 5) is None  # the waiting reader is woken at once
    assert await forgotten.next(0.01) is None  # the event it held was dropped unread

    def opened(*args):
        raise AssertionError("a forgotten session's record was decoded")

    before = erased_skipped()
    monkeypatch.setattr(follow, "decode_event", opened)
    hub._dispatch(b"s-gone", b"{}")
    assert erased_skipped() == before + 1
    assert hub.is_erased("s-gone") and not hub.is_erased("s-kept")
    later = hub.subscribe("s-gone")  # a new follower of a session known forgotten starts ended
    assert later.erased


async def test_with_erasure_issuers_only_a_record_signed_by_one_ends_a_session():
    private, public = new_issuer_key()
    intruder, _ = new_issuer_key()
    issuer = LedgerSigner("ops", private)
    hub = TranscriptHub(SETTINGS.model_copy(update={"erasure_issuers": {"ops": public}}))
    hub._loop = asyncio.get_running_loop()
    followed = hub.subscribe("s-1")
    moved = ledger_record("s-1")
    moved._headers = ledger_record("s-2", issuer, "ops:cli:x").headers()  # another record's signature
    forged = [
        ledger_record("s-1"),  # unsigned
        ledger_record("s-1", LedgerSigner("ops", intruder), "ops:cli:x"),  # the issuer's name, another key
        ledger_record("s-1", issuer, "cli:x"),  # signed, but requested_by does not name the issuer
        moved,
    ]
    for record in forged:
        hub._handle_erasure(record)
        await settle()
        assert not followed.erased and not hub.is_erased("s-1")
    hub._handle_erasure(ledger_record("s-1", issuer, "ops:cli:x"))
    await settle()
    assert followed.erased


async def test_a_ledger_record_that_does_not_decode_is_skipped_and_ends_nothing():
    hub = TranscriptHub(SETTINGS)
    hub._loop = asyncio.get_running_loop()
    subscription = hub.subscribe("s-1")
    hub._handle_erasure(Record("t.erasures", b"s-1", b'{"session_id": "s-1"}'))  # no fleet, no requester
    hub._handle_erasure(Record("t.erasures", b"s-1", b"x" * 10_000))  # larger than any erasure record
    await settle()
    assert not subscription.erased and not hub.is_erased("s-1")


async def test_the_hub_remembers_a_bounded_number_of_forgotten_ids(monkeypatch):
    monkeypatch.setattr(follow, "ERASED_IDS_KEPT", 3)
    hub = TranscriptHub(SETTINGS)
    for n in range(5):
        hub.mark_erased(f"s-{n}")
    assert [hub.is_erased(f"s-{n}") for n in range(5)] == [False, False, True, True, True]


async def test_the_hub_consume_loop_routes_ledger_records_beside_the_transcript(monkeypatch):
    records = [transcript_record("s-1", 0), ledger_record("s-1"), transcript_record("s-1", 1)]
    assigned: list[tuple[str, int]] = []
    first_read = threading.Event()  # the ledger record comes once the test has the first event

    class Consumer:
        def poll(self, timeout: float):
            if not records or (len(records) == 2 and not first_read.wait(timeout)):
                return None
            return records.pop(0)

        def assign(self, partitions) -> None:
            assigned.extend((tp.topic, tp.partition) for tp in partitions)

        def close(self) -> None:
            pass

    class Offsets:
        def partitions(self, topic: str) -> list[int]:
            return [0, 1] if topic == "t.transcript" else [0]

        def close(self) -> None:
            pass

    monkeypatch.setattr(follow.kafka, "consumer", lambda *a, **k: Consumer())
    monkeypatch.setattr(follow.kafka, "OffsetReader", lambda settings: Offsets())
    hub = TranscriptHub(SETTINGS)
    subscription = hub.subscribe("s-1")
    hub.start()
    try:
        first = await subscription.next(10)
        assert first is not None and first.seq == 0
        first_read.set()
        for _ in range(1000):
            if subscription.erased:
                break
            await asyncio.sleep(0.01)
    finally:
        await asyncio.to_thread(hub.stop)
    assert subscription.erased and await subscription.next(0.01) is None  # the record after it never came
    assert sorted(assigned) == [("t.erasures", 0), ("t.transcript", 0), ("t.transcript", 1)]


async def test_the_hub_asks_the_store_about_the_sessions_it_serves_and_survives_an_outage():
    asked: list[list[str]] = []
    fail = threading.Event()
    fail.set()

    class Erasures:
        def forgotten_among(self, session_ids):
            asked.append(sorted(session_ids))
            if fail.is_set():
                fail.clear()
                raise RuntimeError("the store is away")
            return {"s-gone"} & set(session_ids)

    store = SimpleNamespace(reading=lambda: contextlib.nullcontext(Erasures()))
    hub = TranscriptHub(SETTINGS, store=store, erasure_check_seconds=0.01)  # type: ignore[arg-type]
    hub._loop = asyncio.get_running_loop()
    gone, kept = hub.subscribe("s-gone"), hub.subscribe("s-kept")
    watcher = threading.Thread(target=hub._watch_erasures, daemon=True)
    watcher.start()
    try:
        for _ in range(1000):
            if gone.erased:
                break
            await asyncio.sleep(0.01)
        rounds = len(asked)
        for _ in range(1000):
            if len(asked) >= rounds + 2:
                break
            await asyncio.sleep(0.01)
    finally:
        hub._stopping.set()
        await asyncio.to_thread(watcher.join, 5)
    assert gone.erased and not kept.erased
    assert asked[:2] == [["s-gone", "s-kept"], ["s-gone", "s-kept"]]  # the first round failed; the next one told
    assert asked[-1] == ["s-kept"]  # a session known forgotten is not asked about again


class Hub:
    """The hub's subscriber side, fed by the test."""

    def __init__(self) -> None:
        self.subscriptions: list[Subscription] = []

    def subscribe(self, session_id: str, *, max_bytes: int) -> Subscription:
        self.subscriptions.append(Subscription(session_id, max_bytes=max_bytes))
        return self.subscriptions[-1]

    def unsubscribe(self, subscription: Subscription) -> None:
        self.subscriptions.remove(subscription)


def fetch_of(visible: list[StoredEvent], erased: set[str]):
    async def fetch(session_id: str, after_seq: int) -> EventPage:
        if session_id in erased:
            raise SessionErased(session_id)
        return EventPage([e for e in visible if e.seq > after_seq], False)

    return fetch


async def test_a_follower_in_the_live_tail_ends_with_session_erased_when_the_hub_learns_it():
    hub = Hub()
    follower = follow_session(fetch_of([live(0)], set()), hub, "s", -1, poll_seconds=30)
    assert (await anext(follower)).seq == 0
    [subscription] = hub.subscriptions
    subscription.offer(live(1))
    assert (await anext(follower)).seq == 1
    waiting = asyncio.ensure_future(anext(follower))
    await settle()
    subscription.offer(live(2))
    subscription.end_erased()  # the live event before it is dropped with it
    with pytest.raises(SessionErased) as erased:
        await asyncio.wait_for(waiting, 5)  # well before poll_seconds
    assert erased.value.session_id == "s"
    assert hub.subscriptions == []


async def test_a_follower_reading_the_store_ends_when_the_store_says_the_session_is_forgotten():
    hub, erased = Hub(), set()
    stored = [live(seq) for seq in range(3)]
    follower = follow_session(fetch_of(stored[:1], erased), hub, "s", -1, poll_seconds=0.01)
    assert (await anext(follower)).seq == 0
    erased.add("s")  # no ledger record reached the hub (its broker away): the store tells
    with pytest.raises(SessionErased):
        await asyncio.wait_for(anext(follower), 5)


async def test_a_backlog_page_stops_at_the_erasure_between_two_events():
    hub = Hub()
    follower = follow_session(fetch_of([live(seq) for seq in range(5)], set()), hub, "s", -1, poll_seconds=30)
    assert (await anext(follower)).seq == 0
    hub.subscriptions[0].end_erased()
    with pytest.raises(SessionErased):
        await anext(follower)


async def test_store_fetch_reads_nothing_of_a_session_with_an_erasure_row():
    class Erasures:
        def forgotten_among(self, session_ids):
            return {"s-gone"} & set(session_ids)

    store = SimpleNamespace(reading=lambda: contextlib.nullcontext(Erasures()))
    fetch = store_fetch(store)  # type: ignore[arg-type]
    with pytest.raises(SessionErased):
        await fetch("s-gone", -1)


def test_a_token_s_audit_id_is_stable_short_and_not_the_token():
    token = "a-secret-token-of-fleet-a"
    table = TokenTable({"other": ["b"], token: ["a"]})
    scope = table.scope_of(f"Bearer {token}")
    assert scope is not None
    assert scope.token_id == hashlib.sha256(token.encode()).hexdigest()[:TOKEN_ID_HEX_DIGITS]
    assert len(scope.token_id) == 12 and token not in scope.token_id
    reordered = TokenTable({token: ["a"], "other": ["b"]}).scope_of(f"Bearer {token}")
    assert reordered is not None and reordered.token_id == scope.token_id  # not its position
    assert table.scope_of("Bearer other").token_id != scope.token_id
