"""The DLQ record format shared by every stage (turnlog/dlq.py)."""

from __future__ import annotations

from turnlog.dlq import MAX_REASON_BYTES, REASON_HEADER, dlq_headers


def test_a_dlq_reason_is_bounded_in_bytes_whatever_it_quotes():
    reason = "invalid: Invalid enum value '" + "é" * 5000 + "' - at `$.type`"
    header = dict(dlq_headers(reason, "t.events", 0, 7))[REASON_HEADER]
    assert len(header) <= MAX_REASON_BYTES and header.decode("utf-8").startswith("invalid: Invalid enum value")
    assert dict(dlq_headers("fenced: short", "t.events", 0, 7))[REASON_HEADER] == b"fenced: short"
