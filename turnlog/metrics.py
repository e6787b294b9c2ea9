"""Prometheus metrics of the pipeline, served on ``TURNLOG_METRICS_PORT`` when it is set."""

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
]

EVENTS_EMITTED = Counter("turnlog_sequencer_emitted_total", "Events emitted to the ordered transcript.")
DUPLICATES_DROPPED = Counter("turnlog_sequencer_duplicates_total", "Events dropped as duplicates by (session_id, seq).")
DLQ_ROUTED = Counter("turnlog_dlq_total", "Records routed to the DLQ, by stage and reason class.", ["stage", "reason"])
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
