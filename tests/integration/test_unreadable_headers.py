"""A record whose header name is not UTF-8 on the real broker (which accepts it: Kafka does not
validate header names), among healthy sessions' records of the same partition: the sequencer
(the real Faust worker, whose aiokafka consumer cannot unpack it) dead-letters it with its
reason and keeps going, the healthy sessions are stored intact and finalized; the log reader
of the gap re-reads and the replay read past it too."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from turnlog import kafka
from turnlog.dlq import REASON_HEADER
from turnlog.kafka import partition_for
from turnlog.kafka.record_headers import NOT_UTF8_NAME, UnreadableHeaders
from turnlog.ops.replay import replay_events
from turnlog.schemas import encode_event
from turnlog.sinks import open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.stream_processors.log_ranges import LogRangeReader

from tests.integration.test_pipeline import finalized, stored_turns
from tests.integration.test_poison_records import dead_letters
from tests.support import EventFactory, signed_event, wait_until
from tests.unreadable_headers import send_unreadable

pytestmark = pytest.mark.integration
TIMEOUT = 120
REASON = f"unreadable: {NOT_UTF8_NAME}".encode()


def session_on(partition: int, partitions: int, prefix: str) -> EventFactory:
    """A fresh session whose records go to ``partition``."""
    while True:
        session_id = f"{prefix}-{uuid.uuid4().hex[:10]}"
        if partition_for(session_id, partitions) == partition:
            return EventFactory(session_id)


def produce(settings, events) -> None:
    """Write ``events`` to the events topic as the recorder does (idempotent, keyed by session)."""
    producer = kafka.producer(settings, client_id="test-unreadable", delivery_timeout_seconds=30)
    for event in events:
        key, value, headers = signed_event(settings, event)
        producer.produce(settings.topics.events, key=key, value=value, headers=headers)
    assert producer.flush(30) == 0


def poison(settings, partition: int) -> tuple[bytes, int]:
    """Write a record whose header name is not UTF-8 to ``partition`` (its value a valid event of a
    session of its own, which nothing but the unreadable header refuses); ``(value, offset)``."""
    intruder = session_on(partition, settings.partitions, "intruder")
    value = encode_event(intruder.started())
    offset = asyncio.run(send_unreadable(settings.bootstrap_servers, settings.topics.events, partition,
                                         intruder.session_id.encode(), value))
    return value, offset


def turns_of(f: EventFactory) -> list[tuple[int, str, str, str]]:
    return [(0, "A", f"first of {f.session_id}", "complete"), (1, "A", f"second of {f.session_id}", "complete")]


def test_the_sequencer_dead_letters_a_record_with_a_non_utf8_header_name_and_keeps_the_partitions_sessions(
    new_pipeline, postgres_databases
):
    pipeline = new_pipeline(())  # nothing runs yet: the first fetch holds records before and after the poison
    settings = pipeline.settings
    partition = 0
    before, during = (session_on(partition, settings.partitions, name) for name in ("before", "during"))
    elsewhere = [session_on(p, settings.partitions, "elsewhere") for p in range(1, settings.partitions)]
    produce(settings, [before.started(), before.completed(1, 0, f"first of {before.session_id}")])
    produce(settings, [e for f in elsewhere for e in (f.started(), f.completed(1, 0, f"first of {f.session_id}"))])
    first_poison = poison(settings, partition)
    produce(settings, [before.completed(2, 1, f"second of {before.session_id}"), before.ended(3, last_turn=1)])
    produce(settings, [e for f in elsewhere for e in (f.completed(2, 1, f"second of {f.session_id}"),
                                                      f.ended(3, last_turn=1))])

    pipeline.start("sequencer", "sink")
    pipeline.wait_ready()
    wait_until(lambda: finalized(pipeline, before.session_id), timeout=TIMEOUT,
               what="the session around the first poison finalized")
    # A second poison at the end of the partition while the worker runs: the records before it
    # are handed on though nothing follows it yet.
    produce(settings, [during.started(), during.completed(1, 0, f"first of {during.session_id}")])
    second_poison = poison(settings, partition)
    wait_until(lambda: len(stored_turns(pipeline, during.session_id)) == 1, timeout=TIMEOUT,
               what="the turn written just before the second poison stored")
    produce(settings, [during.completed(2, 1, f"second of {during.session_id}"), during.ended(3, last_turn=1)])

    for f in [before, during, *elsewhere]:
        wait_until(lambda f=f: finalized(pipeline, f.session_id), timeout=TIMEOUT, what=f"{f.session_id} finalized")
        assert [tuple(t) for t in stored_turns(pipeline, f.session_id)] == turns_of(f)
    rejects = wait_until(lambda: (found := dead_letters(settings, partition)) and len(found) >= 2 and found,
                         timeout=TIMEOUT, what="both poison records in the DLQ")
    assert sorted((value, headers[REASON_HEADER], int(headers["turnlog-source-offset"]),
                   headers["turnlog-source-topic"]) for value, headers in rejects) == sorted(
        (value, REASON, offset, settings.topics.events.encode()) for value, offset in (first_poison, second_poison)
    )
    assert pipeline.processes["sequencer"].alive()

    # The gap re-read's log reader reads past it too: the poison comes with why its headers are unreadable.
    reader = LogRangeReader(settings, settings.topics.events, f"{settings.sequencer_group}-test")
    try:
        read = reader.read(partition, 0, second_poison[1])
    finally:
        reader.close()
    unreadable = [(offset, headers) for offset, _, _, headers in read if isinstance(headers, UnreadableHeaders)]
    assert [(offset, headers.reason) for offset, headers in unreadable] == [
        (first_poison[1], NOT_UTF8_NAME), (second_poison[1], NOT_UTF8_NAME)
    ]
    assert len(read) == second_poison[1] + 1

    # The replay skips and counts them, and rebuilds the healthy sessions.
    store = open_store(postgres_databases.create())
    try:
        upgrade_to_head(store.engine)
        result = replay_events(settings, store)
        assert result.rejected_reasons == {"unreadable": 2}
        assert result.sessions_finalized == 2 + len(elsewhere)
    finally:
        store.engine.dispose()
