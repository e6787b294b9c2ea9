"""The sink through a rebalance during a store outage, on the real broker: it waits out the outage with
its partitions paused, and a partition the group moves to another member meanwhile and later gives back
is read again. librdkafka keeps a partition's pause across assignments; the sink resumes each partition
it is assigned (``SinkService._seek_to_stored``).

This is what a zombie sink goes through (tests/cluster/test_zombies.py, ``sink.after_write``): woken, its
commit fails (the server ended its idle transaction), it pauses to retry, its lost session revokes its
partitions, and the rebalance its rejoin starts gives some of them back."""

from __future__ import annotations

import threading
import uuid

from confluent_kafka import Producer
from sqlalchemy import select

from turnlog import kafka
from turnlog.producers import partition_for
from turnlog.schemas import encode_event
from turnlog.settings import TurnlogSettings
from turnlog.sinks.exceptions import StoreUnavailableError
from turnlog.sinks.service import SinkService
from turnlog.sinks.tables import sessions

from tests.integration.conftest import RunningService
from tests.support import EventFactory, wait_until

TIMEOUT = 60


def one_session_per_partition(settings: TurnlogSettings) -> dict[int, EventFactory]:
    """``{partition: a fresh session whose id maps to it}``, for every partition of the transcript."""
    found: dict[int, EventFactory] = {}
    while len(found) < settings.partitions:
        session_id = f"rebalance-{uuid.uuid4().hex[:8]}"
        found.setdefault(partition_for(session_id, settings.partitions), EventFactory(session_id))
    return found


def produce(settings: TurnlogSettings, records: list[tuple[int, EventFactory, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "enable.idempotence": True})
    for partition, factory, value in records:
        producer.produce(settings.topics.transcript, key=factory.session_id.encode(), value=value, partition=partition)
    assert producer.flush(10) == 0


def test_a_partition_moved_away_and_back_while_the_store_is_down_is_read_again(transcript, monkeypatch):
    settings, store = transcript
    by_partition = one_session_per_partition(settings)

    outage = threading.Event()
    outage.set()
    tried = threading.Semaphore(0)  # released at each batch the sink tries to write
    real_apply = store.offsets.apply_tracked

    def apply_tracked(*args, **kwargs):
        tried.release()
        if outage.is_set():
            raise StoreUnavailableError("store unavailable: the test's outage")
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(store.offsets, "apply_tracked", apply_tracked)
    service = SinkService(settings, store)
    seeked_back = threading.Event()  # the sink resumed its assignment after the outage
    real_seek_back = service._seek_back

    def seek_back(consumer):
        real_seek_back(consumer)
        seeked_back.set()

    monkeypatch.setattr(service, "_seek_back", seek_back)

    produce(settings, [(p, f, encode_event(f.started())) for p, f in by_partition.items()])
    sink = RunningService(service)
    other = kafka.consumer(settings, group_id=settings.sink_group)
    other_open = True

    def moved_to_other() -> set[int]:
        other.poll(0.2)  # serves the other member's rebalance; what it reads is not kept
        return {tp.partition for tp in other.assignment()}

    try:
        # The sink holds a batch it cannot write: its partitions are paused while it retries.
        assert tried.acquire(timeout=TIMEOUT), "the sink never tried to write its first batch"
        # Another member joins: the rebalance moves some partitions to it, during the outage.
        other.subscribe([settings.topics.transcript])
        moved = wait_until(moved_to_other, timeout=TIMEOUT, what="the other member assigned partitions")
        outage.clear()
        assert seeked_back.wait(TIMEOUT), "the sink did not resume after the outage"
        # The other member leaves: every partition is the sink's again, the moved ones included.
        other.close()
        other_open = False
        produce(settings, [(p, f, encode_event(f.completed(1, 0, f"turn of partition {p}"))) for p, f in by_partition.items()]
                + [(p, f, encode_event(f.ended(2, last_turn=0))) for p, f in by_partition.items()])

        def finalized() -> set[int]:
            with store.engine.connect() as conn:
                done = set(conn.execute(select(sessions.c.id).where(sessions.c.status == "finalized")).scalars())
            return {p for p, f in by_partition.items() if f.session_id in done}

        wait_until(lambda: finalized() == set(by_partition), timeout=TIMEOUT,
                   what=f"a session on every partition finalized (moved away and back: {sorted(moved)})")
        assert sink.thread.is_alive() and sink.failure is None
    finally:
        if other_open:
            other.close()
        sink.stop()
    assert sink.failure is None
