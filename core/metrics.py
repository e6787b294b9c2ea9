"""Prometheus metrics of the pipeline, served on ``TURNLOG_METRICS_PORT`` when it is set."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

__all__ = [
    "EVENTS_EMITTED",
    "DUPLICATES_DROPPED",
    "DLQ_ROUTED",
    "GAPS_OPENED",
    "SESSIONS_FINALIZED",
    "SINK_RECORDS",
    "SINK_BATCH_SECONDS",
]

EVENTS_EMITTED = Counter("turnlog_sequencer_emitted_total", "Events emitted to the ordered transcript.")
DUPLICATES_DROPPED = Counter("turnlog_sequencer_duplicates_total", "Events dropped as duplicates by (session_id, seq).")
DLQ_ROUTED = Counter("turnlog_dlq_total", "Records routed to the DLQ, by stage and reason class.", ["stage", "reason"])
GAPS_OPENED = Counter("turnlog_sequencer_gaps_total", "Times a session started waiting for a missing seq.")
SESSIONS_FINALIZED = Counter("turnlog_sessions_finalized_total", "Sessions this finalizer finalized.")
SINK_RECORDS = Counter("turnlog_sink_records_total", "Transcript records handled by the sink, by outcome.", ["outcome"])
SINK_BATCH_SECONDS = Histogram("turnlog_sink_batch_seconds", "Time to write one batch and its offsets (seconds).")
