"""The DLQ record format shared by every stage (turnlog/dlq.py)."""

from __future__ import annotations

from turnlog.dlq import MAX_REASON_BYTES, REASON_CLASSES, REASON_HEADER, dlq_headers, reason_class


def test_a_dlq_reason_is_bounded_in_bytes_whatever_it_quotes():
    reason = "invalid: Invalid enum value '" + "é" * 5000 + "' - at `$.type`"
    header = dict(dlq_headers(reason, "t.events", 0, 7))[REASON_HEADER]
    assert len(header) <= MAX_REASON_BYTES and header.decode("utf-8").startswith("invalid: Invalid enum value")
    assert dict(dlq_headers("fenced: short", "t.events", 0, 7))[REASON_HEADER] == b"fenced: short"


def test_the_dlq_metric_label_is_a_bounded_set_whatever_a_reason_says():
    assert reason_class("fenced: epoch 0 is older than the session's epoch 1") == "fenced"
    assert reason_class("after session.ended: seq 9 arrived after the session ended") == "after session.ended"
    assert reason_class("sink: value too long for type character varying(200)") == "sink"
    # A reason without a known class word (or none at all) never becomes a label of its own.
    assert reason_class("card 4111 1111 1111 1111: declined") == "other"
    assert reason_class("no colon at all " + "x" * 300) == "other"
    assert all(reason_class(f"{word}: anything") == word for word in REASON_CLASSES)
