"""Poison records on the real broker and Postgres: the sink and the analytics projection (each a SinkService, run
in this process so one record's planning can be made to fail) dead-letter a record nested ~1,000 levels deep and a
record whose planning raises, with their reasons, and keep storing the healthy sessions of the same partition."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from sqlalchemy import select

from turnlog.dlq import REASON_HEADER
from turnlog.producers import partition_for
from turnlog.schemas import encode_event
from turnlog.schemas.events import MAX_EVENT_DEPTH
from turnlog.settings import TurnlogSettings
from turnlog.sinks import analytics as analytics_module
from turnlog.sinks import batch as sink_batch
from turnlog.sinks.analytics import AnalyticsProjection
from turnlog.sinks.service import SinkService
from turnlog.sinks.tables import sessions, transcript_turns

from tests.integration.conftest import RunningService
from tests.support import EventFactory, partition_records, wait_until

TIMEOUT = 60
PLANNING_BUG = "the text whose planning raises"
DEEP_REASON = f"invalid: the event's JSON nests deeper than {MAX_EVENT_DEPTH} levels"


def ids_on_one_partition(settings: TurnlogSettings, count: int) -> list[str]:
    """``count`` fresh session ids that all map to the same partition."""
    ids: list[str] = []
    while len(ids) < count:
        candidate = f"poison-{uuid.uuid4().hex[:8]}"
        if not ids or partition_for(candidate, settings.partitions) == partition_for(ids[0], settings.partitions):
            ids.append(candidate)
    return ids


def deeply_nested_start(f: EventFactory) -> bytes:
    """``f``'s session.started whose metadata nests 1,000 levels (a RecursionError in every reader, before)."""
    return encode_event(f.started())[:-1] + b',"metadata":{"k":' + b"[" * 1_000 + b"]" * 1_000 + b"}}"


def produce_transcript(settings: TurnlogSettings) -> tuple[list[str], dict[bytes, int]]:
    """Two healthy sessions and two poisoned ones, interleaved on one partition of the transcript (bypassing the
    sequencer). Returns the healthy ids and ``{poison value: its offset}``."""
    healthy_a, healthy_b, deep_id, buggy_id = ids_on_one_partition(settings, 4)
    a, b, deep, buggy = (EventFactory(sid) for sid in (healthy_a, healthy_b, deep_id, buggy_id))
    records = [
        (a, encode_event(a.started())),
        (deep, deeply_nested_start(deep)),
        (a, encode_event(a.completed(1, 0, "hello", speaker="agent"))),
        (buggy, encode_event(buggy.started())),
        (buggy, encode_event(buggy.completed(1, 0, PLANNING_BUG, speaker="agent"))),
        (b, encode_event(b.started())),
        (b, encode_event(b.completed(1, 0, "hi", speaker="user"))),
        (a, encode_event(a.ended(2, last_turn=0))),
        (b, encode_event(b.ended(2, last_turn=0))),
    ]
    partition = partition_for(healthy_a, settings.partitions)
    offsets: dict[bytes, int] = {}
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "enable.idempotence": True})

    def delivered(err, msg):
        assert err is None, err
        offsets[msg.value()] = msg.offset()

    for factory, value in records:
        producer.produce(settings.topics.transcript, key=factory.session_id.encode(), value=value,
                         partition=partition, on_delivery=delivered)
    assert producer.flush(10) == 0
    poison = {value: offsets[value] for _, value in (records[1], records[4])}
    return [healthy_a, healthy_b], poison


def dead_letters(settings: TurnlogSettings, partition: int) -> list[tuple[bytes, dict[str, bytes]]]:
    """Every DLQ record of ``partition``, with its headers."""
    return [(value, dict(headers))
            for _, value, headers in partition_records(settings.bootstrap_servers, settings.topics.dlq, partition)]


def assert_poison_dead_lettered(settings: TurnlogSettings, partition: int, poison: dict[bytes, int]) -> None:
    rejects = wait_until(lambda: (r := dead_letters(settings, partition)) and len(r) >= 2 and r,
                         timeout=TIMEOUT, what="the two poison records in the DLQ")
    by_value = {value: headers for value, headers in rejects}
    assert set(by_value) == set(poison)
    deep, buggy = sorted(poison, key=poison.get)  # the deeply nested start comes first
    assert by_value[deep][REASON_HEADER].decode().startswith(DEEP_REASON)
    assert by_value[buggy][REASON_HEADER] == b"invalid: cannot be planned (RuntimeError)"
    for value, headers in by_value.items():
        assert headers["turnlog-source-offset"] == str(poison[value]).encode()
        assert headers["turnlog-source-topic"] == settings.topics.transcript.encode()
        assert PLANNING_BUG.encode() not in headers[REASON_HEADER]


def test_the_sink_dead_letters_poison_and_stores_the_healthy_sessions_of_the_partition(transcript, monkeypatch):
    settings, store = transcript
    from_event = sink_batch.TurnRow.from_event

    def planned(event):
        if event.text == PLANNING_BUG:
            raise RuntimeError("a planning bug")
        return from_event(event)

    monkeypatch.setattr(sink_batch.TurnRow, "from_event", staticmethod(planned))
    healthy, poison = produce_transcript(settings)
    sink = RunningService(SinkService(settings, store))
    try:
        def finalized():
            with store.engine.connect() as conn:
                rows = conn.execute(select(sessions.c.id, sessions.c.status).where(sessions.c.id.in_(healthy))).all()
            return {status for _, status in rows} == {"finalized"} and len(rows) == 2

        wait_until(finalized, timeout=TIMEOUT, what="both healthy sessions finalized")
        assert_poison_dead_lettered(settings, partition_for(healthy[0], settings.partitions), poison)
        with store.engine.connect() as conn:
            turns = conn.execute(
                select(transcript_turns.c.session_id, transcript_turns.c.text, transcript_turns.c.status)
                .order_by(transcript_turns.c.session_id)
            ).all()
            stored = set(conn.execute(select(sessions.c.id)).scalars())
        assert sorted(map(tuple, turns)) == sorted([(healthy[0], "hello", "complete"), (healthy[1], "hi", "complete")])
        # The buggy session's start was stored (only its turn was refused); the deep one left nothing.
        assert len(stored) == 3 and set(healthy) < stored
        assert sink.thread.is_alive() and sink.failure is None
    finally:
        sink.stop()
    assert sink.failure is None


def test_analytics_dead_letters_poison_and_counts_the_healthy_sessions_of_the_partition(transcript, monkeypatch):
    settings, store = transcript
    real_decode = analytics_module.decode_event

    def decode(value):
        event = real_decode(value)
        if getattr(event, "text", None) == PLANNING_BUG:
            raise RuntimeError("a planning bug")
        return event

    monkeypatch.setattr(analytics_module, "decode_event", decode)
    healthy, poison = produce_transcript(settings)
    projection = AnalyticsProjection(store)
    service = RunningService(SinkService(settings, store, consumer_group=settings.analytics_group,
                                         write=projection.write, component="analytics"))
    try:
        def figures():
            with store.engine.connect() as conn:
                got = projection.figures(conn, "tests")
            return got if got.ended_sessions == 2 else None

        got = wait_until(figures, timeout=TIMEOUT, what="both healthy sessions counted")
        assert_poison_dead_lettered(settings, partition_for(healthy[0], settings.partitions), poison)
        # Started: the two healthy sessions and the buggy one (its start decoded); the deep one never counted.
        assert (got.started_sessions, got.ended_sessions, got.active_sessions) == (3, 2, 1)
        assert got.talk_time == {"agent": (1, 0.9), "user": (1, 0.9)}  # the buggy turn was not counted
        assert service.thread.is_alive() and service.failure is None
    finally:
        service.stop()
    assert service.failure is None
