"""What the benchmark measures from outside the pipeline: lag, durable throughput,
commit latency, Postgres commit and WAL counters, resident memory, sink batches;
and, inside this process, the recorder's spool commits (``spool_counters``)."""

from __future__ import annotations

import contextlib
import math
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from turnlog import kafka
from turnlog.schemas import TurnStatus
from turnlog.settings import TurnlogSettings

__all__ = [
    "cpu_seconds",
    "cpu_us_per_event",
    "Sample",
    "Sampler",
    "pipeline_drained",
    "PgCounters",
    "pg_counters",
    "rss_bytes",
    "turn_latencies_ms",
    "sink_batches",
    "parse_sink_batches",
    "require_commit_timestamps",
    "SpoolCounters",
    "spool_counters",
    "bucket_quantile",
    "spool_cost",
    "lag_stats",
]


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
        """Records not yet through the pipeline: the sequencer's lag plus the sink's. The
        sequencer writes the transcript in transactions (``sequencer_transactions``), and the
        marker that ends each is an offset too: the sink's share counts the markers after its
        last stored record (at least one per partition written), so it stays above 0 once
        drained; :meth:`Sampler.drained` tells."""
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
        # Reads the sequencer group's commits; it never subscribes, so it never joins the group.
        self._consumer = kafka.consumer(settings, group_id=settings.sequencer_group)
        self._offsets: kafka.OffsetReader | None = None  # for drained(), made at its first use

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()
        if self._offsets is not None:
            self._offsets.close()
        return self.samples

    def drained(self) -> bool:
        """Whether the latest sample finds everything through the pipeline (:func:`pipeline_drained`),
        the transcript's record ends read through an ``OffsetReader`` of the sampler's own."""

        def record_end() -> int:
            if self._offsets is None:
                self._offsets = kafka.OffsetReader(self.settings)
            return sum(self._offsets.record_ends(self.settings.topics.transcript).values())

        return pipeline_drained(self.samples[-1] if self.samples else None, record_end)

    def sample(self, conn: psycopg.Connection) -> Sample:
        topics, n = self.settings.topics, self.settings.partitions
        events = [TopicPartition(topics.events, p) for p in range(n)]
        events_end = sum(self._consumer.get_watermark_offsets(tp, timeout=5)[1] for tp in events)
        transcript_end = sum(
            self._consumer.get_watermark_offsets(TopicPartition(topics.transcript, p), timeout=5)[1] for p in range(n)
        )
        sequenced = sum(max(tp.offset, 0) for tp in self._consumer.committed(events, timeout=5))
        stored = _one_row(conn.execute(
            "SELECT coalesce(sum(next_offset), 0) FROM sink_offsets WHERE consumer_group = %s AND topic = %s",
            (self.settings.sink_group, topics.transcript),
        ))[0]
        return Sample(time.monotonic(), events_end, sequenced, transcript_end, int(stored))

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                with contextlib.suppress(Exception):  # a missed sample is a gap in the plot, not a failed run
                    self.samples.append(self.sample(conn))
                self._stop.wait(self.interval)


def pipeline_drained(latest: Sample | None, transcript_record_end: Callable[[], int]) -> bool:
    """Whether ``latest`` finds everything through the pipeline: the sequencer has committed
    every event, and the sink has stored up to the transcript's last committed record.

    ``transcript_record_end()``: the sum over the transcript's partitions of the offset after
    each one's last committed record (``OffsetReader.record_ends``); called only when the
    sequencer is done and the sink's offsets stop short of the high watermarks, which then
    end in transaction markers (or records not yet stored). The sequencer commits an event's
    offset after the transaction that holds its records, so none is still open then.
    """
    if latest is None or latest.events_end > latest.sequenced:
        return False
    if latest.transcript_end == latest.stored:
        return True
    return transcript_record_end() <= latest.stored


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
        commits = _one_row(conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)))[0]
        wal_sync, wal_write = _one_row(conn.execute("SELECT wal_sync, wal_write FROM pg_stat_wal"))
        # The snapshot's xmax is the next xid to assign; reading it assigns none.
        next_xid = _one_row(conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"))[0]
    return PgCounters(int(commits), int(wal_sync), int(wal_write), int(next_xid))


def _one_row(cursor: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """The row of a query that always answers one (an aggregate, a SHOW, a statistics view)."""
    row = cursor.fetchone()
    assert row is not None
    return row


def require_commit_timestamps(dsn: str) -> None:
    """Raises RuntimeError unless Postgres tracks commit timestamps (the latency probe needs them)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if _one_row(conn.execute("SHOW track_commit_timestamp"))[0] != "on":
            raise RuntimeError(
                "Postgres runs without track_commit_timestamp = on (turn-to-durable latency needs it); "
                "deploy/postgres.sh sets it: restart with `bash deploy/postgres.sh restart`"
            )


def turn_latencies_ms(dsn: str, key_prefix: str) -> list[float]:
    """Milliseconds from each completed turn's ``emitted_at`` to the commit of its row, of the sessions
    whose key starts with ``key_prefix`` (a ``LIKE`` prefix: ``workload.replayed_keys``).

    The row's ``xmin`` is the transaction that wrote the completed turn (nothing
    writes a complete row again), and ``pg_xact_commit_timestamp`` its commit time.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT EXTRACT(EPOCH FROM pg_xact_commit_timestamp(t.xmin) - e.emitted_at) * 1000"
            " FROM transcript_turns t JOIN session_events e ON e.session_id = t.session_id AND e.seq = t.seq"
            f" WHERE t.session_id LIKE %s AND t.status = '{TurnStatus.COMPLETE}'",
            (key_prefix + "%",),
        ).fetchall()
    return [float(r[0]) for r in rows if r[0] is not None]


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, seconds) process ``pid`` has used so far, from /proc."""
    import os

    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_us_per_event(
    before: dict[str, float], after: dict[str, float], events: int, *, seconds: float
) -> dict[str, Any]:
    """CPU microseconds each process used per event between two readings of
    :func:`cpu_seconds` (``{name: seconds}``), over the ``events`` that went through
    meanwhile, and the cores each used over those ``seconds``; the pipeline's total
    is the sum over every process read. NaN per event when no event went through."""
    used = {name: after[name] - before[name] for name in before if name in after}
    per_event = {name: cpu / events * 1e6 if events > 0 else float("nan") for name, cpu in used.items()}
    return {
        "events": events,
        "seconds": seconds,
        "us_per_event": per_event,
        "pipeline_us_per_event": sum(per_event.values()) if events > 0 else float("nan"),
        "cores": {name: cpu / seconds if seconds > 0 else float("nan") for name, cpu in used.items()},
    }


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
    return parse_sink_batches(text)


def parse_sink_batches(text: str) -> SinkBatches:
    """:class:`SinkBatches` from the sink's metrics in the Prometheus text format
    (parsed by ``prometheus_client.parser``); a figure the text lacks is 0."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("turnlog_sink_batch_seconds_count", "turnlog_sink_batch_seconds_sum"):
                values[sample.name] = sample.value
            elif sample.name == "turnlog_sink_records_total" and sample.labels.get("outcome") == "applied":
                values["applied"] = sample.value
    return SinkBatches(
        values.get("turnlog_sink_batch_seconds_count", 0.0), values.get("applied", 0.0),
        values.get("turnlog_sink_batch_seconds_sum", 0.0)
    )


# -- the recorder's spool (in this process: the load generator's recorders) -------------------
_SPOOL_COMMIT = "turnlog_spool_commit_seconds"


@dataclass(frozen=True, slots=True)
class SpoolCounters:
    """The spool's Prometheus figures in this process (cumulative): fsynced commits
    (``turnlog_spool_commit_seconds`` count), their summed wall time (seconds), the
    histogram's cumulative buckets ``(upper bound in seconds, commits <= it)``, and
    events the broker acknowledged (``turnlog_spool_drained_total``)."""

    commits: float
    seconds: float
    buckets: tuple[tuple[float, float], ...]
    drained: float

    def __sub__(self, other: SpoolCounters) -> SpoolCounters:
        before = dict(other.buckets)
        return SpoolCounters(
            self.commits - other.commits,
            self.seconds - other.seconds,
            tuple((bound, count - before.get(bound, 0.0)) for bound, count in self.buckets),
            self.drained - other.drained,
        )


def spool_counters() -> SpoolCounters:
    """Read the spool's metrics from ``prometheus_client.REGISTRY`` (``get_sample_value``).

    Every ``SessionRecorder`` of the process adds to the same metrics, so take
    these around a phase in which only the load generator records.
    """
    from prometheus_client import REGISTRY

    from turnlog.metrics import SPOOL_COMMIT_SECONDS

    def value(name: str, labels: dict[str, str] | None = None) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    # The bucket bounds as the histogram labels them ("0.0005", ..., "+Inf").
    bounds = [
        s.labels["le"]
        for metric in SPOOL_COMMIT_SECONDS.collect()
        for s in metric.samples
        if s.name == f"{_SPOOL_COMMIT}_bucket"
    ]
    return SpoolCounters(
        commits=value(f"{_SPOOL_COMMIT}_count"),
        seconds=value(f"{_SPOOL_COMMIT}_sum"),
        buckets=tuple((float(le), value(f"{_SPOOL_COMMIT}_bucket", {"le": le})) for le in bounds),
        drained=value("turnlog_spool_drained_total"),
    )


def bucket_quantile(buckets: Sequence[tuple[float, float]], q: float) -> tuple[float, float]:
    """Bounds ``(lower, upper)`` of the ``q``-th percentile (0..100, nearest rank)
    of a histogram given as cumulative buckets ``(upper bound, count <= it)``.

    The value lies in ``(lower, upper]``: a histogram knows no more than its
    bucket. ``upper`` is ``inf`` if it lies past the last finite bound; both
    are NaN when the histogram is empty.
    """
    ordered = sorted(buckets)
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        return float("nan"), float("nan")
    rank = max(1, math.ceil(q / 100 * total))
    lower = 0.0
    for bound, count in ordered:
        if count >= rank:
            return lower, bound
        lower = bound
    return lower, float("inf")  # the buckets do not reach the total: only with no +Inf bucket


def spool_cost(delta: SpoolCounters, *, turns: int, events: int) -> dict[str, Any]:
    """What the spool cost a phase: ``delta`` (counters after minus before) over
    the ``turns`` completed and ``events`` recorded in it.

    Commits are fsyncs: each spool commit is one WAL append and one fsync
    (``synchronous=FULL``), shared by every event queued at that moment (group
    commit). Times are microseconds of wall time of the whole commit (inserts
    and fsync). The p99 is known only to its histogram bucket: ``commit_p99_us_upper``
    is that bucket's upper bound (the p99 is at most this), ``commit_p99_us_lower``
    the bound below it.
    """
    commits = delta.commits
    lower, upper = bucket_quantile(delta.buckets, 99)
    return {
        "commits": commits,
        "turns": turns,
        "events": events,
        "fsyncs_per_turn": commits / turns if turns else float("nan"),
        "fsyncs_per_event": commits / events if events else float("nan"),
        "events_per_commit": events / commits if commits else float("nan"),
        "commit_us_mean": delta.seconds / commits * 1e6 if commits else float("nan"),
        "commit_us_per_turn": delta.seconds / turns * 1e6 if turns else float("nan"),
        "commit_p99_us_lower": lower * 1e6,
        "commit_p99_us_upper": upper * 1e6,
        "commit_seconds": delta.seconds,
        "drained": delta.drained,
    }


def lag_stats(samples: Sequence[Sample], *, rate: float) -> dict[str, Any]:
    """The pipeline's lag over ``samples`` (records not yet through it, as in
    :attr:`Sample.lag`), split into the sequencer's share (events not yet
    processed) and the sink's (transcript records not yet stored): mean, p50,
    p99 (nearest rank) and max; and the mean and p99 in seconds at ``rate``
    events/s (how long the newest record waits behind them)."""
    from turnlog.tools.bench.baselines import percentile

    def stats(values: list[int]) -> dict[str, float]:
        return {
            "mean": sum(values) / len(values) if values else float("nan"),
            "p50": percentile(values, 50),
            "p99": percentile(values, 99),
            "max": max(values) if values else float("nan"),
        }

    total = [s.lag for s in samples]
    out: dict[str, Any] = {
        "samples": len(samples),
        "records": stats(total),
        "sequencer_records": stats([s.events_end - s.sequenced for s in samples]),
        "sink_records": stats([s.transcript_end - s.stored for s in samples]),
    }
    out["mean_seconds"] = out["records"]["mean"] / rate if rate > 0 else float("nan")
    out["p99_seconds"] = out["records"]["p99"] / rate if rate > 0 else float("nan")
    return out
