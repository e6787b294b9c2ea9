"""Prometheus metrics of the pipeline, served on ``TURNLOG_METRICS_PORT`` when it is set.

One naming scheme: ``turnlog_<component>_<what>_<unit>``, seconds and bytes as
base units, counters end in ``_total``. Every metric a service exports is
declared here (the consumer-lag gauges are filled by ``turnlog lag-exporter``,
``turnlog/kafka/lag.py``), and ``docs/observability.md`` lists them
all in one table; ``tests/unit/test_observability_docs.py`` keeps the two in step.
Labels are bounded: topic, partition, consumer group, stage, reason class,
outcome, component; never a session id.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "EVENTS_EMITTED",
    "DUPLICATES_DROPPED",
    "DLQ_ROUTED",
    "GAPS_OPENED",
    "OFFSET_JUMPS",
    "UNREADABLE_RECORDS",
    "SESSIONS_FINALIZED",
    "SINK_RECORDS",
    "SINK_BATCH_SECONDS",
    "SPOOL_EVENTS",
    "SPOOL_BYTES",
    "SPOOL_OLDEST_SECONDS",
    "SPOOL_DRAINED",
    "RECORDER_DEGRADED",
    "SPOOL_COMMIT_SECONDS",
    "SPOOL_QUARANTINED",
    "LIVE_RECORDS_SKIPPED",
    "ERASED_RECORDS_SKIPPED",
    "ERASURES_APPLIED",
    "CONSUMER_LAG_RECORDS",
    "CONSUMER_LAG_SECONDS",
    "TURN_TO_STORE_SECONDS",
    "REORDER_BUFFER_EVENTS",
    "GAPS_OPEN",
    "SPOOL_MAX_BYTES",
    "RECORDER_SESSIONS_OPEN",
    "RESUME_SECONDS",
    "API_LIVE_STREAMS",
    "FINALIZATION_DELAY_SECONDS",
    "SESSIONS_UNFINALIZED",
    "UNFINALIZED_OLDEST_SECONDS",
    "LATENCY_BUCKETS",
]

#: Buckets (seconds) of the latency histograms: turn-to-store, resume, finalization delay.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

EVENTS_EMITTED = Counter("turnlog_sequencer_emitted_total", "Events emitted to the ordered transcript.")
DUPLICATES_DROPPED = Counter("turnlog_sequencer_duplicates_total", "Events dropped as duplicates by (session_id, seq).")
DLQ_ROUTED = Counter(
    "turnlog_dlq_total",
    "Records routed to the DLQ, by stage and reason class (turnlog.dlq.REASON_CLASSES, else 'other').",
    ["stage", "reason"],
)
OFFSET_JUMPS = Counter(
    "turnlog_sequencer_offset_jumps_total",
    "Times the sequencer's consumer skipped offsets of a partition (a stream-processor bug: must stay 0).",
)
UNREADABLE_RECORDS = Counter(
    "turnlog_unreadable_records_total",
    "Records a Faust worker's consumer (aiokafka) could not unpack (a header name that is not UTF-8), by topic: "
    "read with confluent-kafka instead and handed on as unreadable (the sequencer dead-letters them).",
    ["topic"],
)
GAPS_OPENED = Counter("turnlog_sequencer_gaps_total", "Times a session started waiting for a missing seq.")
SESSIONS_FINALIZED = Counter(
    "turnlog_sessions_finalized_total",
    "Sessions this process finalized (the sink in its batches, or the finalizer's sweep)."
)
SINK_RECORDS = Counter("turnlog_sink_records_total", "Transcript records handled by the sink, by outcome.", ["outcome"])
SINK_BATCH_SECONDS = Histogram("turnlog_sink_batch_seconds", "Time to write one batch and its offsets (seconds).")
SINK_FENCED_BATCHES = Counter(
    "turnlog_sink_fenced_batches_total",
    "Batches a sink dropped unwritten because another sink had claimed their partitions (a zombie sink woke up).",
)

# The recorder's spool (producers/drainer.py); one set per agent process.
SPOOL_EVENTS = Gauge("turnlog_spool_events", "Events in the recorder's spool not yet acknowledged by the broker.")
SPOOL_BYTES = Gauge("turnlog_spool_bytes",
                    "Bytes of event values in the recorder's spool (see TURNLOG_SPOOL_MAX_BYTES).")
SPOOL_OLDEST_SECONDS = Gauge(
    "turnlog_spool_oldest_unacked_seconds", "Age of the oldest event in the spool not yet acknowledged (seconds)."
)
SPOOL_DRAINED = Counter("turnlog_spool_drained_total",
                        "Spooled events acknowledged by the broker (its rate: the drain rate).")
SPOOL_COMMIT_SECONDS = Histogram(
    "turnlog_spool_commit_seconds",
    "One fsynced spool commit (a group of events appended together), wall time (seconds); its count is the fsyncs.",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
)
RECORDER_DEGRADED = Gauge(
    "turnlog_recorder_degraded",
    "1 while the recorder runs on its spool alone (the broker did not acknowledge in time)."
)
SPOOL_QUARANTINED = Counter(
    "turnlog_spool_quarantined_total",
    "Spooled events the producer refused for good (e.g. too large), set aside in the spool's quarantined table.",
)

# The API's and `turnlog tail`'s transcript hub (turnlog/follow.py).
LIVE_RECORDS_SKIPPED = Counter(
    "turnlog_live_records_skipped_total",
    "Transcript records the live hub skipped because decoding or handing them out failed, by reason "
    "(invalid: not a valid event; error: anything else). Followers still read them from the store.",
    ["reason"],
)
ERASED_RECORDS_SKIPPED = Counter(
    "turnlog_erased_records_skipped_total",
    "Records of forgotten sessions dropped unread (sink, analytics, replay, live hub, spool), by component.",
    ["component"],
)
ERASURES_APPLIED = Counter(
    "turnlog_erasures_applied_total", "Erasure ledger records applied to the store, by projection.", ["component"]
)

# Consumer lag per group and partition, read from outside the consumers (a paused or frozen consumer
# cannot report its own), published by `turnlog lag-exporter` alone (turnlog/kafka/lag.py). The API reads lag for
# /ops but does not publish it: its gauges would go stale whenever no page is open.
CONSUMER_LAG_RECORDS = Gauge(
    "turnlog_consumer_lag_records",
    "Records of a partition its consumer group has not processed: the partition's end offset (last stable offset) "
    "minus the group's committed offset (the sink's: its sink_offsets row); 0 when only transaction markers remain.",
    ["group", "topic", "partition"],
)
CONSUMER_LAG_SECONDS = Gauge(
    "turnlog_consumer_lag_seconds",
    "Age of the oldest record of a partition its consumer group has not processed (now minus that record's "
    "timestamp, seconds, at most the time since the collector saw the partition end before it); 0 when the group "
    "is caught up; NaN when that record was not fetched before the read's deadline, or has no timestamp (<= 0).",
    ["group", "topic", "partition"],
)

# The sink: a turn's journey, from its event's emitted_at to the commit of the batch that stored it.
TURN_TO_STORE_SECONDS = Histogram(
    "turnlog_sink_turn_to_store_seconds",
    "Completed turns: the turn.completed event's emitted_at to the commit of the sink batch that stored it (seconds; "
    "the agent's clock against the sink's, clamped at 0).",
    buckets=LATENCY_BUCKETS,
)

# The sequencer's reorder buffer (stream_processors/sequencing.py), this worker's assigned partitions.
REORDER_BUFFER_EVENTS = Gauge(
    "turnlog_sequencer_reorder_buffer_events",
    "Events the sequencer holds back, waiting for a missing seq of their session (this worker's partitions).",
)
GAPS_OPEN = Gauge(
    "turnlog_sequencer_gaps_open",
    "Sessions waiting for a missing seq on this worker's partitions.",
)

SPOOL_MAX_BYTES = Gauge(
    "turnlog_spool_max_bytes",
    "The spool's capacity (TURNLOG_SPOOL_MAX_BYTES): turnlog_spool_bytes over it is how full.",
)
RECORDER_SESSIONS_OPEN = Gauge(
    "turnlog_recorder_sessions_open", "Sessions this process is recording (started or resumed, not yet ended)."
)
RESUME_SECONDS = Histogram(
    "turnlog_resume_seconds",
    "Resumes (the barrier's wait and grant), wall time by outcome: granted, timeout, erased, refused, error (seconds).",
    ["outcome"],
    buckets=LATENCY_BUCKETS,
)
API_LIVE_STREAMS = Gauge("turnlog_api_live_streams", "Live transcript streams (SSE) the API holds open.")

FINALIZATION_DELAY_SECONDS = Histogram(
    "turnlog_finalization_delay_seconds",
    "Sessions finalized: the session.ended event's ended_at to the commit that finalized it (seconds; the agent's "
    "clock against the finalizing process's, clamped at 0).",
    buckets=LATENCY_BUCKETS,
)
SESSIONS_UNFINALIZED = Gauge(
    "turnlog_finalizer_sessions_unfinalized",
    "Sessions ended in the store but not finalized, as the finalizer's last sweep found them.",
)
UNFINALIZED_OLDEST_SECONDS = Gauge(
    "turnlog_finalizer_unfinalized_oldest_seconds",
    "How long ago the oldest ended but unfinalized session ended, at the finalizer's last sweep (seconds; 0 if none).",
)
