"""Consumer lag (turnlog/kafka/lag.py) against what a producer or an operator may do: a record's
timestamp is the producer's (CreateTime), so a hostile or skewed one must not make the lag read as
decades; a deleted topic must not take the other topics' lag with it."""

from __future__ import annotations

import functools
import math
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from turnlog.kafka.lag import CommittedSource, LagMonitor
from turnlog.sinks import open_store
from turnlog.sinks.offsets import stored_group_offsets

from tests.support import wait_until

TIMEOUT = 60


def committed_at(settings, group: str, topic: str, offset: int) -> None:
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def test_a_record_stamped_in_1970_is_not_decades_of_lag(transcript):
    settings, _ = transcript
    topic, group = settings.topics.events, f"lag-stamp-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    producer.produce(topic, b"honest", key=b"s", partition=0)
    assert producer.flush(10) == 0
    committed_at(settings, group, topic, 1)  # the group has processed the honest record: caught up
    monitor = LagMonitor(settings, committed_sources=[CommittedSource(group, (topic,))])
    try:
        before_first_read = time.time()
        caught_up = wait_until(lambda: [lag for lag in monitor.read(timeout=20) if lag.partition == 0] or None,
                               timeout=TIMEOUT, what="the first read of partition 0")
        assert (caught_up[0].records, caught_up[0].seconds) == (0, 0.0)
        producer.produce(topic, b"stamped 1970", key=b"s", partition=0, timestamp=1)  # 1 ms after the epoch
        assert producer.flush(10) == 0
        lag = wait_until(lambda: [lag for lag in monitor.read(timeout=20) if lag.partition == 0 and lag.records]
                         or None, timeout=TIMEOUT, what="the 1970 record seen")[0]
        # appended after the first read saw the partition end before it: younger than that read
        assert lag.records == 1 and 0.0 <= lag.seconds <= time.time() - before_first_read
    finally:
        monitor.close()


def test_a_topic_that_does_not_exist_leaves_the_other_topics_lag_read(transcript):
    settings, _ = transcript
    events, group = settings.topics.events, f"lag-missing-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    producer.produce(events, b"unprocessed", key=b"s", partition=0)
    assert producer.flush(10) == 0
    committed_at(settings, group, events, 0)
    missing = f"{settings.topic_prefix}.deleted-{uuid.uuid4().hex[:8]}"
    stored = CommittedSource("stored-group", (settings.topics.transcript, missing),
                             lambda topics: {(settings.topics.transcript, 0): 0, (missing, 0): 5})
    monitor = LagMonitor(settings, committed_sources=[CommittedSource(group, (events,)), stored])
    try:
        lags = monitor.read(timeout=20)
    finally:
        monitor.close()
    assert {(lag.group, lag.topic, lag.partition): lag.records for lag in lags if lag.partition == 0} == {
        (group, events, 0): 1, ("stored-group", settings.topics.transcript, 0): 0}


def test_a_record_stamped_before_the_epoch_has_an_unknown_age_not_decades(transcript):
    settings, _ = transcript
    topic, group = settings.topics.events, f"lag-negative-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    producer.produce(topic, b"stamped -5 ms", key=b"s", partition=0, timestamp=-5)  # the broker takes it
    assert producer.flush(10) == 0
    committed_at(settings, group, topic, 0)
    monitor = LagMonitor(settings, committed_sources=[CommittedSource(group, (topic,))])
    try:
        [lag] = [lag for lag in monitor.read(timeout=20) if lag.partition == 0]
    finally:
        monitor.close()
    assert lag.records == 1 and math.isnan(lag.seconds)


def test_a_store_that_never_answers_leaves_the_kafka_groups_lag_read(transcript):
    settings, _ = transcript
    events, group = settings.topics.events, f"lag-hung-store-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    producer.produce(events, b"unprocessed", key=b"s", partition=0)
    assert producer.flush(10) == 0
    committed_at(settings, group, events, 0)
    with socket.create_server(("127.0.0.1", 0)) as black_hole:  # accepts, never speaks: a store cut off
        port = black_hole.getsockname()[1]
        hung = open_store(f"postgresql+psycopg://turnlog:x@127.0.0.1:{port}/turnlog")
        stored = CommittedSource("sink-on-hung-store", (settings.topics.transcript,),
                                 functools.partial(stored_group_offsets, hung, "sink-on-hung-store"))
        monitor = LagMonitor(settings, committed_sources=[CommittedSource(group, (events,)), stored])
        read: list = []
        reader = threading.Thread(target=lambda: read.append(monitor.read(timeout=5)), daemon=True)
        reader.start()
        reader.join(timeout=60)  # a liveness bound, not a speed target: without a deadline it never returns
        assert not reader.is_alive(), "the lag read waited on the store past its deadline"
        monitor.close()
    [lags] = read
    assert {(lag.group, lag.partition): lag.records for lag in lags if lag.partition == 0} == {(group, 0): 1}


def test_a_process_whose_store_never_answers_still_exits_after_a_lag_read(transcript):
    settings, _ = transcript
    script = textwrap.dedent(f"""
        import functools, socket
        from turnlog.kafka.lag import CommittedSource, LagMonitor
        from turnlog.settings import TurnlogSettings
        from turnlog.sinks import open_store
        from turnlog.sinks.offsets import stored_group_offsets
        black_hole = socket.create_server(("127.0.0.1", 0))  # accepts, never speaks; open until the exit
        hung = open_store(f"postgresql+psycopg://turnlog:x@127.0.0.1:{{black_hole.getsockname()[1]}}/turnlog")
        source = CommittedSource("g", ({settings.topics.transcript!r},),
                                 functools.partial(stored_group_offsets, hung, "g"))
        with LagMonitor(TurnlogSettings(bootstrap_servers={settings.bootstrap_servers!r}),
                        committed_sources=[source]) as monitor:
            assert monitor.read(timeout=2) == []
    """)
    # a liveness bound, not a speed target: a thread still waiting on the store must not hold the exit
    done = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
