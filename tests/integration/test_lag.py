"""Consumer lag read from outside the consumers, on the real pipeline: the sink frozen
(SIGSTOP) while events arrive, its lag checked against offsets read independently
(the partitions' ends with a consumer of the test's own, the ``sink_offsets`` rows by SQL),
then the sink resumed and its lag back to 0."""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import urllib.request
import uuid

from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from turnlog import kafka
from turnlog.deploy.processes import ServiceProcess, stop_all, turnlog_command
from turnlog.kafka.lag import LagMonitor, pipeline_groups
from turnlog.metrics import CONSUMER_LAG_RECORDS, CONSUMER_LAG_SECONDS
from turnlog.sinks.offsets import stored_group_offsets
from turnlog.sinks.tables import sink_offsets

from tests.support import EventFactory, free_port, signed_event, wait_until

TIMEOUT = 90
#: Longer than Postgres' idle_in_transaction_session_timeout (10 s, sinks/postgres.py).
SETTLE_TIMEOUT = 30
SESSIONS = 6
TURNS = 4


def sink_rows(pipeline) -> dict[int, int]:
    """The sink's stored next offsets on the transcript, by partition, straight from the table."""
    settings = pipeline.settings
    with pipeline.store.engine.connect() as conn:
        rows = conn.execute(
            select(sink_offsets.c.partition, sink_offsets.c.next_offset).where(
                sink_offsets.c.consumer_group == settings.sink_group,
                sink_offsets.c.topic == settings.topics.transcript,
            )
        ).all()
    return {r.partition: r.next_offset for r in rows}


def transcript_ends(pipeline) -> dict[int, int]:
    """Each transcript partition's last stable offset, by a read_committed consumer of the test's own."""
    settings = pipeline.settings
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": f"test-ends-{uuid.uuid4()}",
                         "isolation.level": "read_committed"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(settings.topics.transcript, p), timeout=10,
                                                  cached=False)[1]
                for p in range(settings.partitions)}
    finally:
        consumer.close()


def sequencer_caught_up(pipeline) -> bool:
    """The sequencer committed every event of the events topic (so it has emitted them all),
    by a consumer of the test's own."""
    settings = pipeline.settings
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": settings.sequencer_group})
    try:
        tps = [TopicPartition(settings.topics.events, p) for p in range(settings.partitions)]
        committed = {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in tps}
    finally:
        consumer.close()
    return all(committed[p] == ends[p] or (ends[p] == 0 and committed[p] < 0) for p in ends)


def sink_lag(monitor: LagMonitor, pipeline) -> dict[int, tuple[int, float]]:
    settings = pipeline.settings
    return {lag.partition: (lag.records, lag.seconds) for lag in monitor.read(timeout=20)
            if lag.group == settings.sink_group and lag.topic == settings.topics.transcript}


def record_sessions(settings, count: int) -> None:
    """``count`` sessions of ``TURNS`` turns each (2 + TURNS events) on the events topic."""
    producer = kafka.producer(settings, client_id="test-lag", delivery_timeout_seconds=10)
    for _ in range(count):
        f = EventFactory(f"lag-{uuid.uuid4().hex[:8]}")
        events = [f.started(), *(f.completed(1 + t, t, f"turn {t}") for t in range(TURNS)),
                  f.ended(1 + TURNS, last_turn=TURNS - 1)]
        for event in events:
            key, value, headers = signed_event(settings, event)
            producer.produce(settings.topics.events, key=key, value=value, headers=headers)
    assert producer.flush(10) == 0


def test_lag_of_a_frozen_sink_matches_independent_offsets_and_returns_to_zero(new_pipeline):
    pipeline = new_pipeline(("sequencer", "sink"))
    pipeline.wait_ready()
    settings = pipeline.settings
    monitor = LagMonitor(settings, committed_sources=pipeline_groups(
        settings, stored_offsets=functools.partial(stored_group_offsets, pipeline.store)))
    try:
        # Caught up first: a session stored, every partition at 0 (the commit markers are no lag).
        record_sessions(settings, 1)
        wait_until(lambda: sink_rows(pipeline) and all(r == 0 for r, _ in sink_lag(monitor, pipeline).values()),
                   timeout=TIMEOUT, what="the sink caught up")

        sink = pipeline.processes["sink"].popen
        sink.send_signal(signal.SIGSTOP)
        try:
            record_sessions(settings, SESSIONS)
            # Every new event is on the transcript: the sequencer (still running) committed them all.
            wait_until(lambda: sequencer_caught_up(pipeline), timeout=TIMEOUT, what="the sequencer caught up")
            # A commit the sink sent just before its SIGSTOP lands when Postgres gets to it (or its
            # transaction is ended after idle_in_transaction_session_timeout): the figures are
            # compared once the store has settled, each read afresh.
            observed: dict[str, dict] = {}

            def lag_matches_offsets() -> bool:
                stored, ends = sink_rows(pipeline), transcript_ends(pipeline)
                observed["lags"] = sink_lag(monitor, pipeline)
                observed["expected"] = {p: ends[p] - stored.get(p, 0) for p in range(settings.partitions)}
                return {p: records for p, (records, _) in observed["lags"].items()} == observed["expected"]

            with contextlib.suppress(AssertionError):  # the assertion below shows the difference
                wait_until(lag_matches_offsets, timeout=SETTLE_TIMEOUT, what="the frozen sink's lag settled")
            lags, expected = observed["lags"], observed["expected"]
            assert {p: records for p, (records, _) in lags.items()} == expected
            assert sum(expected.values()) >= SESSIONS * (2 + TURNS)
            lagging = [p for p, records in expected.items() if records > 0]
            first_seconds = {p: lags[p][1] for p in lagging}
            assert all(not math.isnan(s) and s >= 0 for s in first_seconds.values())
            # The oldest unprocessed record only ages while the sink is frozen.
            wait_until(lambda: all(sink_lag(monitor, pipeline)[p][1] > first_seconds[p] + 1.0 for p in lagging),
                       timeout=TIMEOUT, what="the seconds lag grew")
            # Published: the gauges carry the same figures.
            monitor.publish(monitor.read(timeout=20))
            for p in range(settings.partitions):
                labels = (settings.sink_group, settings.topics.transcript, str(p))
                assert CONSUMER_LAG_RECORDS.labels(*labels)._value.get() == expected[p]
                assert (CONSUMER_LAG_SECONDS.labels(*labels)._value.get() > 0) == (expected[p] > 0)
        finally:
            sink.send_signal(signal.SIGCONT)

        wait_until(lambda: all(lag == (0, 0.0) for lag in sink_lag(monitor, pipeline).values()),
                   timeout=TIMEOUT, what="the sink's lag back to 0")
        stored, ends = sink_rows(pipeline), transcript_ends(pipeline)
        assert all(stored[p] <= ends[p] for p in range(settings.partitions))
        # The sequencer's group is reported too, from its commits in Kafka.
        assert {lag.topic for lag in monitor.read(timeout=20) if lag.group == settings.sequencer_group} == {
            settings.topics.events}
    finally:
        monitor.close()


def test_a_group_that_never_ran_is_not_reported_and_stale_series_are_removed(new_pipeline):
    pipeline = new_pipeline(("sequencer", "sink"))
    pipeline.wait_ready()
    settings = pipeline.settings
    record_sessions(settings, 1)
    monitor = LagMonitor(settings, committed_sources=pipeline_groups(
        settings, stored_offsets=functools.partial(stored_group_offsets, pipeline.store)))
    try:
        wait_until(lambda: any(lag.group == settings.sink_group for lag in monitor.read(timeout=20)),
                   timeout=TIMEOUT, what="the sink's offsets stored")
        lags = monitor.read(timeout=20)
        assert settings.analytics_group not in {lag.group for lag in lags}  # no analytics projection runs
        monitor.publish(lags)
        labels = (settings.sink_group, settings.topics.transcript, "0")
        assert labels in {tuple(s.labels.values()) for m in CONSUMER_LAG_RECORDS.collect() for s in m.samples}
        monitor.publish([lag for lag in lags if lag.group != settings.sink_group])
        assert labels not in {tuple(s.labels.values()) for m in CONSUMER_LAG_RECORDS.collect() for s in m.samples}
    finally:
        monitor.close()


def scraped_lag(port: int, group: str) -> dict[str, float]:
    """``{partition: turnlog_consumer_lag_records}`` of ``group``'s transcript series on the exporter's /metrics."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "turnlog_consumer_lag_records" and sample.labels["group"] == group \
                    and sample.labels["topic"].endswith(".transcript"):
                found[sample.labels["partition"]] = sample.value
    return found


def test_the_lag_exporter_serves_the_lag_of_every_group(new_pipeline, tmp_path):
    pipeline = new_pipeline(("sequencer", "sink"))
    pipeline.wait_ready()
    settings = pipeline.settings
    record_sessions(settings, 2)
    port = free_port()
    exporter = ServiceProcess("lag-exporter", turnlog_command("lag-exporter", "--port", str(port), "--interval", "1"),
                              settings.as_environment(), tmp_path / "lag-exporter.log")
    try:
        # Caught up: every transcript partition of the sink at 0, served by the exporter's own read.
        lags = wait_until(lambda: (found := scraped_lag(port, settings.sink_group)) and len(found) == settings.partitions
                          and all(v == 0 for v in found.values()) and found,
                          timeout=TIMEOUT, what="the sink's lag served at 0")
        assert set(lags) == {str(p) for p in range(settings.partitions)}
        assert scraped_lag(port, settings.analytics_group) == {}  # no analytics projection runs
    finally:
        stop_all([exporter])
    assert exporter.popen.returncode == 0
