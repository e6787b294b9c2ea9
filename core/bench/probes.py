"""What the benchmark measures from outside the pipeline: lag, durable throughput,
commit latency, Postgres commit and WAL counters, resident memory, sink batches."""

from __future__ import annotations

import threading
import time
import urllib.request
from dataclasses import dataclass, field

import psycopg
from confluent_kafka import Consumer, TopicPartition

from turnlog.settings import TurnlogSettings
from turnlog.stream_processors.progress import progress_group

__all__ = ["cpu_seconds", "Sample", "Sampler", "PgCounters", "pg_counters", "rss_bytes", "turn_latencies_ms", "sink_batches", "require_commit_timestamps"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at the pipeline: monotonic seconds, records in each topic, what the
    sequencer and the sink have consumed (sums over partitions)."""

    at: float
    events_end: int
    sequenced: int
    transcript_end: int
    stored: int

    @property
    def lag(self) -> int:
        """Records not yet through the pipeline: the sequencer's lag plus the sink's."""
        return (self.events_end - self.sequenced) + (self.transcript_end - self.stored)


class Sampler:
    """Samples every ``interval`` seconds in a thread until stopped."""

    def __init__(self, settings: TurnlogSettings, dsn: str, interval: float = 0.5) -> None:
        self.settings = settings
        self.dsn = dsn
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._consumer = Consumer(
            {"bootstrap.servers": settings.bootstrap_servers, "group.id": progress_group(settings.sequencer_group), "enable.auto.commit": False}
        )

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()
        return self.samples

    def sample(self, conn: psycopg.Connection) -> Sample:
        topics, n = self.settings.topics, self.settings.partitions
        events = [TopicPartition(topics.events, p) for p in range(n)]
        events_end = sum(self._consumer.get_watermark_offsets(tp, timeout=5)[1] for tp in events)
        transcript_end = sum(self._consumer.get_watermark_offsets(TopicPartition(topics.transcript, p), timeout=5)[1] for p in range(n))
        sequenced = sum(max(tp.offset, 0) for tp in self._consumer.committed(events, timeout=5))
        stored = conn.execute(
            "SELECT coalesce(sum(next_offset), 0) FROM sink_offsets WHERE consumer_group = %s AND topic = %s",
            (self.settings.sink_group, topics.transcript),
        ).fetchone()[0]
        return Sample(time.monotonic(), events_end, sequenced, transcript_end, int(stored))

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                try:
                    self.samples.append(self.sample(conn))
                except Exception:  # a missed sample is a gap in the plot, not a failed run
                    pass
                self._stop.wait(self.interval)


@dataclass(frozen=True, slots=True)
class PgCounters:
    """Cumulative counters: transactions committed in the database (read-only ones
    too), WAL syncs and writes of the cluster, transaction ids assigned."""

    xact_commit: int
    wal_sync: int
    wal_write: int
    #: Transaction ids assigned in the cluster: one per transaction that wrote
    #: (read-only transactions, like the probes' own, get none).
    write_transactions: int

    def __sub__(self, other: PgCounters) -> PgCounters:
        return PgCounters(
            self.xact_commit - other.xact_commit,
            self.wal_sync - other.wal_sync,
            self.wal_write - other.wal_write,
            self.write_transactions - other.write_transactions,
        )


def pg_counters(admin_dsn: str, database: str) -> PgCounters:
    """Read from another database (``admin_dsn``), so reading does not count as a commit of ``database``.

    Statistics are flushed by backends at most once a second (``pg_stat_*``), so
    take these around phases of several seconds.
    """
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        commits = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)).fetchone()[0]
        wal_sync, wal_write = conn.execute("SELECT wal_sync, wal_write FROM pg_stat_wal").fetchone()
        # The snapshot's xmax is the next xid to assign; reading it assigns none.
        next_xid = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()[0]
    return PgCounters(int(commits), int(wal_sync), int(wal_write), int(next_xid))


def require_commit_timestamps(dsn: str) -> None:
    """Raises RuntimeError unless Postgres tracks commit timestamps (the latency probe needs them)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SHOW track_commit_timestamp").fetchone()[0] != "on":
            raise RuntimeError(
                "Postgres runs without track_commit_timestamp = on (turn-to-durable latency needs it); "
                "deploy/postgres.sh sets it: restart with `bash deploy/postgres.sh restart`"
            )


def turn_latencies_ms(dsn: str, session_prefix: str) -> list[float]:
    """Milliseconds from each completed turn's ``emitted_at`` to the commit of its row.

    The row's ``xmin`` is the transaction that wrote the completed turn (nothing
    writes a complete row again), and ``pg_xact_commit_timestamp`` its commit time.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT EXTRACT(EPOCH FROM pg_xact_commit_timestamp(t.xmin) - e.emitted_at) * 1000"
            " FROM transcript_turns t JOIN session_events e ON e.session_id = t.session_id AND e.seq = t.seq"
            " WHERE t.session_id LIKE %s AND t.status = 'complete'",
            (session_prefix + "%",),
        ).fetchall()
    return [float(r[0]) for r in rows if r[0] is not None]


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, seconds) process ``pid`` has used so far, from /proc."""
    import os

    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (bytes), from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass(frozen=True, slots=True)
class SinkBatches:
    """The sink's own counters (Prometheus): batches written and records applied."""

    batches: float
    records: float
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def __sub__(self, other: SinkBatches) -> SinkBatches:
        return SinkBatches(self.batches - other.batches, self.records - other.records, self.seconds - other.seconds)


def sink_batches(metrics_port: int) -> SinkBatches:
    """Scrape the sink's ``/metrics``: ``turnlog_sink_batch_seconds`` count and sum, applied records."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("turnlog_sink_batch_seconds_count") or line.startswith("turnlog_sink_batch_seconds_sum"):
            name, value = line.split()
            values[name] = float(value)
        elif line.startswith('turnlog_sink_records_total{outcome="applied"}'):
            values["applied"] = float(line.split()[-1])
    return SinkBatches(
        values.get("turnlog_sink_batch_seconds_count", 0.0), values.get("applied", 0.0), values.get("turnlog_sink_batch_seconds_sum", 0.0)
    )
