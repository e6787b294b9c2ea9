"""End to end on the real broker and Postgres: recorder -> Kafka -> sequencer -> sink,
which finalizes each session in the transaction of the batch that ends it."""

from __future__ import annotations

import threading
import uuid

from confluent_kafka import Producer
from sqlalchemy import select

from turnlog import kafka
from turnlog.ops.audit import fold_events
from turnlog.producers import SessionRecorder, partition_for
from turnlog.schemas import decode_event, encode_event
from turnlog.schemas.session_keys import session_key
from turnlog.sinks.tables import session_events, sessions, transcript_turns

from tests.support import EventFactory, partition_records, provenance, signed_event, wait_until

TIMEOUT = 90


def session_row(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        return conn.execute(select(sessions).where(sessions.c.id == session_id)).mappings().first()


def finalized(pipeline, session_id):
    row = session_row(pipeline, session_id)
    return row if row is not None and row["status"] == "finalized" else None


def stored_turns(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        return conn.execute(
            select(transcript_turns.c.turn_index, transcript_turns.c.speaker, transcript_turns.c.text, transcript_turns.c.status)
            .where(transcript_turns.c.session_id == session_id)
            .order_by(transcript_turns.c.turn_index)
        ).all()


def logged_payloads(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        return conn.execute(
            select(session_events.c.payload).where(session_events.c.session_id == session_id).order_by(session_events.c.seq)
        ).scalars().all()


async def test_round_trip_stores_every_turn_in_order_and_finalizes(pipeline):
    local = f"rt-{uuid.uuid4().hex[:8]}"
    async with SessionRecorder(pipeline.settings) as recorder:
        session = await recorder.start_session(local, fleet="tests", agent_id="a1", metadata={"k": "v"})
        session.update_partial(0, "user", "I would")
        await session.flush_partial()
        await session.complete_turn(0, "user", "I would like to cancel", input_tokens=5)
        await session.complete_turn(1, "agent", "Sure, which plan?", output_tokens=4)
        session.update_partial(2, "user", "The premium")
        await session.end("hangup")
    session_id = session.session_id
    assert session_id == session_key("tests", local)
    row = wait_until(lambda: finalized(pipeline, session_id), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert [tuple(t) for t in stored_turns(pipeline, session_id)] == [
        (0, "user", "I would like to cancel", "complete"),
        (1, "agent", "Sure, which plan?", "complete"),
        (2, "user", "The premium", "interrupted"),
    ]
    folded = fold_events(logged_payloads(pipeline, session_id))
    assert folded.seqs == list(range(6))
    assert (row["turn_count"], row["interrupted_turn_count"], row["input_tokens"], row["output_tokens"]) == (3, 1, 5, 4)
    assert row["duration_seconds"] == folded.duration_seconds
    assert (row["fleet"], row["agent_id"], row["metadata"], row["last_seq"], row["end_seq"]) == ("tests", "a1", {"k": "v"}, 5, 5)


async def test_the_sink_batch_that_ends_a_session_finalizes_it_with_no_finalizer_running(pipeline):
    assert "finalizer" not in pipeline.processes
    local = f"fin-{uuid.uuid4().hex[:8]}"
    session_id = session_key("tests", local)  # watched before it is started
    seen: list[tuple[str, int, int | None]] = []
    stop = threading.Event()

    def watch() -> None:  # every committed state of the row, as often as the database answers
        with pipeline.store.engine.connect() as conn:
            while not stop.is_set():
                row = conn.execute(
                    select(sessions.c.status, sessions.c.last_seq, sessions.c.end_seq).where(sessions.c.id == session_id)
                ).first()
                conn.rollback()  # a fresh snapshot each time
                if row is not None and (not seen or seen[-1] != tuple(row)):
                    seen.append(tuple(row))
                stop.wait(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        async with SessionRecorder(pipeline.settings) as recorder:
            session = await recorder.start_session(local, fleet="tests", agent_id="a1")
            await session.complete_turn(0, "user", "hello", input_tokens=2)
            await session.complete_turn(1, "agent", "hi there", output_tokens=3)
            await session.end("hangup")
        row = wait_until(lambda: finalized(pipeline, session_id), timeout=TIMEOUT, what=f"{session_id} finalized")
    finally:
        stop.set()
        watcher.join()
    # Never committed as ended and complete but not finalized: the aggregates commit with the session.ended.
    assert not [s for s in seen if s[0] == "ended" and s[2] is not None and s[1] >= s[2]], seen
    assert seen[-1] == ("finalized", 3, 3)
    assert (row["turn_count"], row["input_tokens"], row["output_tokens"]) == (2, 2, 3)
    assert f"finalized {session_id}" in pipeline.processes["sink"].log_path.read_text(errors="replace")


def test_an_app_level_resend_with_a_fresh_produce_is_stored_once(pipeline):
    f = EventFactory(f"resend-{uuid.uuid4().hex[:8]}")
    events = [f.started(), f.completed(1, 0, "only once"), f.ended(2, last_turn=0)]
    producer = kafka.producer(pipeline.settings, client_id="test-resend", delivery_timeout_seconds=10)
    topic = pipeline.settings.topics.events
    for event in [events[0], events[1], events[1], events[1], events[2]]:  # three separate produce() calls of seq 1
        key, value, headers = signed_event(pipeline.settings, event)
        producer.produce(topic, key=key, value=value, headers=headers)
    assert producer.flush(10) == 0

    wait_until(lambda: finalized(pipeline, f.session_id), timeout=TIMEOUT, what="the session finalized")
    assert [tuple(t) for t in stored_turns(pipeline, f.session_id)] == [(0, "A", "only once", "complete")]
    assert len(logged_payloads(pipeline, f.session_id)) == 3
    assert finalized(pipeline, f.session_id)["turn_count"] == 1
    # The sequencer dropped the duplicates: the ordered transcript holds seq 1 once.
    seqs = [decode_event(v).seq for v in read_partition(pipeline, pipeline.settings.topics.transcript, f.session_id)]
    assert seqs == [0, 1, 2]


def test_invalid_and_fenced_events_go_to_the_dlq_and_the_pipeline_goes_on(pipeline):
    f = EventFactory(f"dlq-{uuid.uuid4().hex[:8]}")
    producer = Producer({"bootstrap.servers": pipeline.settings.bootstrap_servers, "partitioner": "murmur2_random"})
    topic = pipeline.settings.topics.events
    key = f.session_id.encode()
    junk = b"{this is not json"
    producer.produce(topic, key=key, value=junk, headers=provenance(pipeline.settings, key, junk))
    for event in (f.started(), f.completed(1, 0, "owner", epoch=1), f.completed(2, 1, "zombie", epoch=0),
                  f.ended(2, epoch=1, last_turn=0)):
        key, value, headers = signed_event(pipeline.settings, event)
        producer.produce(topic, key=key, value=value, headers=headers)
    assert producer.flush(10) == 0

    wait_until(lambda: finalized(pipeline, f.session_id), timeout=TIMEOUT, what="the session finalized after bad input")
    assert [tuple(t) for t in stored_turns(pipeline, f.session_id)] == [(0, "A", "owner", "complete")]
    rejects = wait_until(
        lambda: (r := read_partition(pipeline, pipeline.settings.topics.dlq, f.session_id, with_headers=True)) and len(r) >= 2 and r,
        timeout=TIMEOUT, what="two DLQ records",
    )
    reasons = sorted(dict(headers)["turnlog-reason"].decode() for _, headers in rejects)
    assert reasons[0].startswith("fenced: epoch 0") and reasons[1].startswith("invalid:")
    assert {value for value, _ in rejects} >= {b"{this is not json"}


def test_our_partition_for_agrees_with_the_idempotent_producers_murmur2(pipeline):
    producer = kafka.producer(pipeline.settings, client_id="test-partitioner", delivery_timeout_seconds=10)
    delivered = {}
    keys = [f"key-{i}-{uuid.uuid4().hex[:6]}" for i in range(30)]
    for key in keys:
        producer.produce(
            pipeline.settings.topics.dlq, key=key.encode(), value=b"x",
            on_delivery=lambda err, msg, key=key: delivered.__setitem__(key, msg.partition()),
        )
    assert producer.flush(10) == 0
    assert delivered == {key: partition_for(key, pipeline.settings.partitions) for key in keys}


def read_partition(pipeline, topic, session_id, *, with_headers=False, partition=None):
    """Every record of ``session_id`` in ``topic`` (its partition, or ``partition``, from the start)."""
    if partition is None:
        partition = partition_for(session_id, pipeline.settings.partitions)
    records = partition_records(pipeline.settings.bootstrap_servers, topic, partition)
    return [(value, headers) if with_headers else value
            for key, value, headers in records if key == session_id.encode()]


def test_a_record_the_sink_cannot_decode_goes_to_the_dlq_and_other_sessions_are_stored(pipeline):
    f = EventFactory(f"sinkdlq-{uuid.uuid4().hex[:8]}")
    producer = Producer({"bootstrap.servers": pipeline.settings.bootstrap_servers, "partitioner": "murmur2_random"})
    transcript = pipeline.settings.topics.transcript
    key = f.session_id.encode()
    # Bypasses the sequencer: bytes on the ordered transcript that are not an event.
    producer.produce(transcript, key=key, value=b'{"type": "turn.completed", "seq": "not a number"}')
    for event in [f.started(), f.completed(1, 0, "still stored"), f.ended(2, last_turn=0)]:
        producer.produce(transcript, key=key, value=encode_event(event))
    assert producer.flush(10) == 0

    wait_until(lambda: finalized(pipeline, f.session_id), timeout=TIMEOUT, what="the session finalized")
    assert [tuple(t) for t in stored_turns(pipeline, f.session_id)] == [(0, "A", "still stored", "complete")]
    [(value, headers)] = wait_until(
        lambda: read_partition(pipeline, pipeline.settings.topics.dlq, f.session_id, with_headers=True),
        timeout=TIMEOUT, what="the sink's DLQ record",
    )
    headers = dict(headers)
    assert value == b'{"type": "turn.completed", "seq": "not a number"}'
    assert headers["turnlog-reason"].startswith(b"invalid:") and headers["turnlog-source-topic"] == transcript.encode()


async def test_every_transcript_record_carries_the_type_header_of_its_event(pipeline):
    from turnlog.schemas.headers import EVENT_TYPE_HEADER, event_type

    async with SessionRecorder(pipeline.settings) as recorder:
        session = await recorder.start_session(f"hdr-{uuid.uuid4().hex[:8]}", fleet="tests", agent_id="a1")
        session.update_partial(0, "user", "I would")
        await session.flush_partial()
        await session.complete_turn(0, "user", "I would like to cancel", input_tokens=5)
        await session.end("hangup")
    session_id = session.session_id
    wait_until(lambda: finalized(pipeline, session_id), timeout=TIMEOUT, what=f"{session_id} finalized")
    records = read_partition(pipeline, pipeline.settings.topics.transcript, session_id, with_headers=True)
    said = [
        (dict(headers).get(EVENT_TYPE_HEADER), event_type(decode_event(value)).value.encode())
        for value, headers in records
    ]
    assert said and all(header == actual for header, actual in said), said
    assert {actual for _, actual in said} == {b"session.started", b"turn.partial", b"turn.completed", b"session.ended"}
