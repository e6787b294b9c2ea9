"""The ceilings the pipeline is compared with, measured in the same run on the same payloads.

- **K**: raw confluent-kafka, idempotent and ``acks=all``, produce -> consume with
  no processing: events/s, and the p99 produce -> consume latency.
- **S0**: a bare Faust agent that only consumes a topic, ``take_events(1000)`` and
  nothing else (``consume_only.py``): records/s, the floor of any Faust app here.
- **S**: a bare Faust agent copying one topic to another (``passthrough.py``): events/s.
- **P**: the sink's rows (``plan_batch`` of the same payloads) written with raw
  psycopg 3 into the same tables, three ways: ``executemany`` in pipeline mode,
  one ``INSERT ... SELECT FROM unnest(...)`` per table, and ``COPY`` into temp
  staging tables then ``INSERT ... SELECT ... ON CONFLICT``: rows/s and the p99
  commit time of each.
- **unsafe**: what turnlog replaces: hold the session in memory, write it once
  at the end. Its DB writes per session, and what a SIGKILL at 50 % loses,
  from a real process killed halfway.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tenacity import Retrying, retry_if_exception_type, wait_fixed

from turnlog import kafka
from turnlog.kafka.replication import resolve_replication
from turnlog.producers.partitioning import partition_for
from turnlog.schemas import SessionStatus, TurnStatus
from turnlog.settings import TurnlogSettings
from turnlog.sinks.batch import plan_batch
from turnlog.sinks.source_records import SourceMessage

__all__ = [
    "KafkaBaseline",
    "ThroughputBaseline",
    "PostgresMethod",
    "UnsafeBaseline",
    "kafka_baseline",
    "faust_baseline",
    "faust_consume_baseline",
    "batch_rate",
    "postgres_baselines",
    "unsafe_baseline",
    "percentile",
    "produce_all",
    "topic_end",
]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, nearest-rank; NaN if empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True, slots=True)
class KafkaBaseline:
    events_per_second: float
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True, slots=True)
class ThroughputBaseline:
    events_per_second: float


@dataclass(frozen=True, slots=True)
class PostgresMethod:
    method: str
    rows_per_second: float
    p99_commit_ms: float
    batches: int
    #: Mean time of ``commit()`` alone (ms): Postgres's WAL flush (fsync) of one batch.
    mean_commit_ms: float = float("nan")


@dataclass(frozen=True, slots=True)
class UnsafeBaseline:
    commits_per_session: float
    rows_per_session: float
    turns_said_at_kill: int
    turns_stored_after_kill: int


def _admin(settings: TurnlogSettings) -> AdminClient:
    return kafka.admin(settings)


def create_bench_topics(settings: TurnlogSettings, *names: str) -> None:
    admin = _admin(settings)  # held until the futures resolve: a collected client cancels them
    replication = resolve_replication(settings)  # as every topic turnlog creates
    futures = admin.create_topics([
        NewTopic(n, settings.partitions, replication.replication_factor, config=replication.topic_config())
        for n in names
    ])
    for future in futures.values():
        future.result(30)


def delete_topics(settings: TurnlogSettings, *names: str) -> None:
    admin = _admin(settings)
    for future in admin.delete_topics(list(names)).values():
        with contextlib.suppress(Exception):  # best effort: a leftover benchmark topic is harmless
            future.result(30)


def produce_all(settings: TurnlogSettings, topic: str, events: Sequence[tuple[str, bytes]]) -> float:
    """Produce ``events`` (``(key, value)``) with the idempotent producer and wait for every ack; seconds taken.

    A record that finds librdkafka's queue full (``BufferError``) is sent again after
    serving delivery reports (``poll``) for 50 ms, without limit. Its first try is made
    outside tenacity: a ``Retrying`` call costs ~15 µs, which K's throughput would show.
    """
    producer = kafka.producer(settings, client_id="bench-prefill", delivery_timeout_seconds=120)

    def serve_reports(seconds: float) -> None:  # the wait for room in the queue
        producer.poll(seconds)

    while_queue_full = Retrying(retry=retry_if_exception_type(BufferError), wait=wait_fixed(0.05), sleep=serve_reports,
                                reraise=True)
    began = time.monotonic()
    for key, value in events:
        send = functools.partial(producer.produce, topic, key=key.encode(), value=value,
                                 partition=partition_for(key, settings.partitions))
        try:
            send()
        except BufferError:
            while_queue_full(send)
        producer.poll(0)
    producer.flush(120)
    return time.monotonic() - began


def topic_end(consumer: Consumer, topic: str, partitions: int) -> int:
    """Sum of the high watermarks of ``topic``'s partitions (records ever written)."""
    return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions))


def kafka_baseline(
    settings: TurnlogSettings, events: Sequence[tuple[str, bytes]], *, latency_rate: float = 1000.0
) -> KafkaBaseline:
    """K: produce ``events`` as fast as the idempotent producer goes while one
    consumer reads them back (events/s over the whole transfer); then the same
    payloads paced at ``latency_rate`` events/s for the produce -> consume latency
    (saturated, the latency would only measure the producer's queue)."""
    rate, _ = _produce_and_consume(settings, events, pace=None)
    sample = events[: int(latency_rate * 3)]
    _, latencies = _produce_and_consume(settings, sample, pace=latency_rate)
    return KafkaBaseline(rate, percentile(latencies, 50), percentile(latencies, 99))


def _produce_and_consume(
    settings: TurnlogSettings, events: Sequence[tuple[str, bytes]], pace: float | None
) -> tuple[float, list[float]]:
    topic = f"{settings.topic_prefix}.bench-k-{uuid.uuid4().hex[:6]}"
    create_bench_topics(settings, topic)
    latencies: list[float] = []
    ready = threading.Event()
    finished_at = [0.0]

    def consume() -> None:
        consumer = kafka.consumer(settings, group_id=f"{topic}-reader",
                                  **{"auto.offset.reset": "earliest", "fetch.wait.max.ms": 5})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(settings.partitions)])
        consumer.consume(1, 0.5)  # connect before the clock starts
        ready.set()
        deadline = time.monotonic() + 300
        # consume(n, timeout) returns early only with n records: paced, poll briefly
        # so the wait does not become the latency being measured.
        wait = 0.2 if pace is None else 0.002
        while len(latencies) < len(events) and time.monotonic() < deadline:
            for record in consumer.consume(1000, wait):
                if record.error() is None:
                    latencies.append(time.time() * 1000 - record.timestamp()[1])
        finished_at[0] = time.monotonic()
        consumer.close()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    ready.wait(30)
    began = time.monotonic()
    if pace is None:
        produce_all(settings, topic, events)
    else:
        producer = kafka.producer(settings, client_id="bench-k", delivery_timeout_seconds=120)
        # Warm up first: the idempotent producer's first send waits for its producer id.
        producer.produce(f"{topic}", key=b"warm-up", value=b"{}", partition=0)
        producer.flush(30)
        began = time.monotonic()
        for i, (key, value) in enumerate(events):
            wait = began + i / pace - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            producer.produce(topic, key=key.encode(), value=value, partition=partition_for(key, settings.partitions))
            producer.poll(0)
        producer.flush(60)
    reader.join(300)
    delete_topics(settings, topic)
    if pace is not None:
        latencies = sorted(latencies)[: len(events)]  # the warm-up record is the one extra
    return len(latencies) / max(finished_at[0] - began, 1e-9), latencies


def faust_baseline(
    settings: TurnlogSettings, events: Sequence[tuple[str, bytes]], log_dir: Path, timeout: float = 600
) -> ThroughputBaseline:
    """S: pre-fill a topic, start the bare pass-through agent, time from its first copy to the last."""
    run = uuid.uuid4().hex[:6]
    source, target = f"{settings.topic_prefix}.bench-s-{run}.in", f"{settings.topic_prefix}.bench-s-{run}.out"
    create_bench_topics(settings, source, target)
    produce_all(settings, source, events)
    env = {**os.environ, **settings.as_environment(), "TURNLOG_LOG_LEVEL": "WARNING"}
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / "faust-passthrough.log").open("ab") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "turnlog.tools.bench.passthrough", source, target,
             f"{settings.topic_prefix}-bench-s-{run}"],
            env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )
    probe = kafka.consumer(settings, group_id=f"bench-s-{run}-probe")
    try:
        rate = _drain_rate(lambda: topic_end(probe, target, settings.partitions), len(events), timeout, agent)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(20)
        except subprocess.TimeoutExpired:
            agent.kill()
        probe.close()
        delete_topics(settings, source, target)
    return ThroughputBaseline(rate)


def faust_consume_baseline(
    settings: TurnlogSettings, events: Sequence[tuple[str, bytes]], log_dir: Path, timeout: float = 600
) -> ThroughputBaseline:
    """S0: pre-fill a topic, start the consume-only agent (``consume_only.py``); records/s
    from its first batch to its last, as the agent itself timed them."""
    import json

    run = uuid.uuid4().hex[:6]
    source = f"{settings.topic_prefix}.bench-s0-{run}.in"
    create_bench_topics(settings, source)
    produce_all(settings, source, events)
    env = {**os.environ, **settings.as_environment(), "TURNLOG_LOG_LEVEL": "WARNING"}
    log_dir.mkdir(parents=True, exist_ok=True)
    result_path = log_dir / f"faust-consume-only-{run}.json"
    with (log_dir / "faust-consume-only.log").open("ab") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "turnlog.tools.bench.consume_only", source,
             f"{settings.topic_prefix}-bench-s0-{run}", str(len(events)), str(result_path)],
            env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + timeout
        while not result_path.exists():
            if time.monotonic() > deadline or agent.poll() is not None:
                raise RuntimeError(f"the consume-only agent did not read {len(events)} records; see"
                                   f" {log_dir / 'faust-consume-only.log'}")
            time.sleep(0.1)
        result = json.loads(result_path.read_text())
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(20)
        except subprocess.TimeoutExpired:
            agent.kill()
        delete_topics(settings, source)
    return ThroughputBaseline(batch_rate(result["records"], result["first_batch"], result["seconds"]))


def batch_rate(records: int, first_batch: int, seconds: float) -> float:
    """Records/s of a consumer that timed its batches: the records after the first
    batch over the seconds from the first batch to the last (the first batch's
    records arrived before the clock started). NaN if it all came in one batch."""
    if seconds <= 0 or records <= first_batch:
        return float("nan")
    return (records - first_batch) / seconds


def _drain_rate(count: Any, total: int, timeout: float, process: subprocess.Popen[bytes] | None = None) -> float:
    """Records/s from the first one counted until ``total``, polling ``count()``."""
    deadline = time.monotonic() + timeout
    first_at = first = None
    while True:
        done = count()
        now = time.monotonic()
        if done and first_at is None:
            first_at, first = now, done
        if done >= total:
            break
        if now > deadline or (process is not None and process.poll() is not None):
            raise RuntimeError(f"drain stalled at {done}/{total} records")
        time.sleep(0.05)
    return (total - (first or 0)) / max(now - (first_at or now), 1e-9)


# -- P: raw psycopg ----------------------------------------------------------------
_EVENT_COLUMNS = ("session_id", "seq", "epoch", "event_id", "type", "emitted_at", "payload")
_TURN_COLUMNS = ("session_id", "turn_index", "speaker", "text", "status", "started_at", "ended_at", "input_tokens",
                 "output_tokens", "epoch", "seq")
_TURN_TYPES = ("text", "int", "text", "text", "text", "timestamptz", "timestamptz", "bigint", "bigint", "int", "bigint")
_EVENT_TYPES = ("text", "bigint", "int", "text", "text", "timestamptz", "text")
_SESSION_COLUMNS = ("id", "status", "epoch", "last_seq")
_SESSION_TYPES = ("text", "text", "int", "bigint")
_TURN_GUARD = (
    "WHERE (EXCLUDED.epoch, EXCLUDED.seq) > (transcript_turns.epoch, transcript_turns.seq)"
    f" AND NOT (transcript_turns.status = '{TurnStatus.COMPLETE}'"
    f" AND EXCLUDED.status = '{TurnStatus.PARTIAL}')"
)
_TURN_SET = ", ".join(f"{c} = EXCLUDED.{c}" for c in _TURN_COLUMNS[2:])


def _batch_rows(
    batch: Sequence[SourceMessage]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    plan = plan_batch(batch)
    events = [tuple(row[c] for c in _EVENT_COLUMNS) for row in plan.event_rows]
    turns = [tuple(row[c] for c in _TURN_COLUMNS) for row in (t.as_row() for t in plan.turns)]
    sessions = [
        (sid, SessionStatus.ACTIVE, changes.max_epoch, max(changes.seqs)) for sid, changes in plan.sessions.items()
    ]
    return events, turns, sessions


def _sql_insert(table: str, columns: Sequence[str], source: str, conflict: str) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) {source} {conflict}"


_EVENTS_CONFLICT = "ON CONFLICT (session_id, seq) DO NOTHING"
_TURNS_CONFLICT = f"ON CONFLICT (session_id, turn_index) DO UPDATE SET {_TURN_SET} {_TURN_GUARD}"
_SESSIONS_CONFLICT = (
    "ON CONFLICT (id) DO UPDATE SET epoch = GREATEST(sessions.epoch, EXCLUDED.epoch),"
    " last_seq = GREATEST(sessions.last_seq, EXCLUDED.last_seq)"
)


def _write_executemany(conn: psycopg.Connection, events: list, turns: list, sessions: list) -> None:
    with conn.pipeline(), conn.cursor() as cur:
        for table, columns, rows, conflict in (
            ("session_events", _EVENT_COLUMNS, events, _EVENTS_CONFLICT),
            ("sessions", _SESSION_COLUMNS, sessions, _SESSIONS_CONFLICT),
            ("transcript_turns", _TURN_COLUMNS, turns, _TURNS_CONFLICT),
        ):
            values = "VALUES (" + ", ".join(["%s"] * len(columns)) + ")"
            cur.executemany(_sql_insert(table, columns, values, conflict), rows)


def _write_unnest(conn: psycopg.Connection, events: list, turns: list, sessions: list) -> None:
    with conn.cursor() as cur:
        for table, columns, types, rows, conflict in (
            ("session_events", _EVENT_COLUMNS, _EVENT_TYPES, events, _EVENTS_CONFLICT),
            ("sessions", _SESSION_COLUMNS, _SESSION_TYPES, sessions, _SESSIONS_CONFLICT),
            ("transcript_turns", _TURN_COLUMNS, _TURN_TYPES, turns, _TURNS_CONFLICT),
        ):
            if not rows:
                continue
            arrays = [list(column) for column in zip(*rows, strict=True)]
            source = "SELECT * FROM unnest(" + ", ".join(f"%s::{t}[]" for t in types) + ")"
            cur.execute(_sql_insert(table, columns, source, conflict), arrays)


def _write_copy(conn: psycopg.Connection, events: list, turns: list, sessions: list) -> None:
    with conn.cursor() as cur:
        for table, columns, rows, conflict in (
            ("session_events", _EVENT_COLUMNS, events, _EVENTS_CONFLICT),
            ("sessions", _SESSION_COLUMNS, sessions, _SESSIONS_CONFLICT),
            ("transcript_turns", _TURN_COLUMNS, turns, _TURNS_CONFLICT),
        ):
            if not rows:
                continue
            staging = f"staging_{table}"
            cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {staging} (LIKE {table} INCLUDING DEFAULTS) ON COMMIT"
                        " DELETE ROWS")
            with cur.copy(f"COPY {staging} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            # DISTINCT ON: a batch may carry one turn twice; ON CONFLICT allows one row per key.
            key = {"session_events": "session_id, seq", "sessions": "id",
                   "transcript_turns": "session_id, turn_index"}[table]
            order = {"session_events": "", "sessions": "", "transcript_turns": ", epoch DESC, seq DESC"}[table]
            source = f"SELECT DISTINCT ON ({key}) {', '.join(columns)} FROM {staging} ORDER BY {key}{order}"
            cur.execute(_sql_insert(table, columns, source, conflict))


_METHODS = {"executemany+pipeline": _write_executemany, "unnest": _write_unnest, "copy+merge": _write_copy}


def postgres_baselines(dsn: str, events: Sequence[tuple[str, bytes]], batch_size: int) -> list[PostgresMethod]:
    """P: each method writes every batch's rows in one transaction, on empty tables."""
    messages = [
        SourceMessage("bench", partition_for(key, 6), offset, value, key.encode())
        for offset, (key, value) in enumerate(events)
    ]
    batches = [_batch_rows(messages[i : i + batch_size]) for i in range(0, len(messages), batch_size)]
    results = []
    with psycopg.connect(dsn) as conn:
        for name, write in _METHODS.items():
            with conn.cursor() as cur:
                cur.execute("TRUNCATE session_events, transcript_turns, sessions")
            conn.commit()
            commits: list[float] = []
            rows = 0
            began = time.monotonic()
            for batch in batches:
                write(conn, *batch)
                started = time.monotonic()
                conn.commit()
                commits.append((time.monotonic() - started) * 1000)
                rows += sum(len(part) for part in batch)
            seconds = time.monotonic() - began
            results.append(PostgresMethod(name, rows / seconds, percentile(commits, 99), len(batches),
                                          sum(commits) / max(len(commits), 1)))
        with conn.cursor() as cur:
            cur.execute("TRUNCATE session_events, transcript_turns, sessions")
        conn.commit()
    return results


# -- unsafe: in memory, written once at the end ---------------------------------------------
def unsafe_baseline(dsn: str, sessions_dir: Path, *, turns: int, speed: float) -> UnsafeBaseline:
    """Run ``turnlog.tools.bench.unsafe`` (one session held in memory, written at its end),
    SIGKILL it halfway, and count what reached the database."""
    session_id = f"unsafe-{uuid.uuid4().hex[:8]}"

    def command(sid: str) -> list[str]:
        return [sys.executable, "-m", "turnlog.tools.bench.unsafe", dsn, str(sessions_dir), sid, str(turns), str(speed)]

    # First a run to completion (another session id): what one session costs the database.
    finished = subprocess.run(command(f"{session_id}-full") + ["--count-only"], capture_output=True, text=True,
                              timeout=300, check=True)
    commits, rows, seconds = (float(x) for x in finished.stdout.splitlines()[-1].split())
    child = subprocess.Popen(command(session_id), stdout=subprocess.PIPE, text=True)
    said = 0
    deadline = time.monotonic() + seconds / 2
    assert child.stdout is not None
    for line in child.stdout:  # "said N" after each turn
        said = int(line.split()[1])
        if time.monotonic() >= deadline:
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM transcript_turns WHERE session_id = %s", (session_id,)).fetchone()
        assert row is not None  # count(*) answers one row
        stored = row[0]
    return UnsafeBaseline(commits, rows, said, stored)
