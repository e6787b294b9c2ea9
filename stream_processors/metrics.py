"""Prometheus counters of the pipeline (scraped from ``TURNLOG_METRICS_PORT`` when set)."""

from __future__ import annotations

from prometheus_client import Counter

__all__ = ["EVENTS_EMITTED", "DUPLICATES_DROPPED", "DLQ_ROUTED", "GAPS_OPENED", "REPLAYED", "SESSIONS_FINALIZED"]

EVENTS_EMITTED = Counter("turnlog_sequencer_emitted_total", "Events emitted to the ordered transcript.")
DUPLICATES_DROPPED = Counter("turnlog_sequencer_duplicates_total", "Events dropped as duplicates by (session_id, seq).")
DLQ_ROUTED = Counter("turnlog_dlq_total", "Events routed to the DLQ, by reason class.", ["reason"])
GAPS_OPENED = Counter("turnlog_sequencer_gaps_total", "Times a session started waiting for a missing seq.")
REPLAYED = Counter("turnlog_sequencer_replayed_total", "Records re-delivered after a restart (at or below the applied offset).")
SESSIONS_FINALIZED = Counter("turnlog_sessions_finalized_total", "Sessions this finalizer finalized.")
