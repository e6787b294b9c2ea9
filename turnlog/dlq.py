"""The DLQ record format shared by every stage that rejects input.

A DLQ record carries the original bytes as its value (and the original key),
and these headers: ``turnlog-reason`` (why, human-readable, UTF-8) and where it
came from, ``turnlog-source-topic``, ``turnlog-source-partition``,
``turnlog-source-offset``. The reason starts with a class word and a colon
(``invalid:``, ``fenced:``, ``sink:``, ...), which the DLQ metric is labelled by.
"""

from __future__ import annotations

__all__ = ["MAX_REASON_BYTES", "REASON_CLASSES", "REASON_HEADER", "bounded_reason", "dlq_headers", "reason_class"]

REASON_HEADER = "turnlog-reason"


#: Longest reason a DLQ record carries, in bytes of UTF-8: a reason may quote a value of the
#: record (a schema error names what it found), so it is cut here, whatever the stage.
MAX_REASON_BYTES = 1024


def bounded_reason(reason: str) -> str:
    """``reason`` cut to at most :data:`MAX_REASON_BYTES` of UTF-8 (on a character boundary, marked "…")."""
    encoded = reason.encode("utf-8")
    if len(encoded) <= MAX_REASON_BYTES:
        return reason
    return encoded[: MAX_REASON_BYTES - 3].decode("utf-8", "ignore") + "…"


def dlq_headers(reason: str, topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    """Kafka headers for a rejected record (the reason bounded by :func:`bounded_reason`)."""
    return [
        (REASON_HEADER, bounded_reason(reason).encode("utf-8")),
        ("turnlog-source-topic", topic.encode("utf-8")),
        ("turnlog-source-partition", str(partition).encode()),
        ("turnlog-source-offset", str(offset).encode()),
    ]


#: The class words the stages write (the ``reason`` label of ``turnlog_dlq_total``): the sequencer's
#: (stream_processors/sequencer.py, sequencing.py, admission.py) and the sink's (sinks/service.py).
REASON_CLASSES = frozenset({
    "after session.ended", "epoch not issued", "fenced", "forged fleet", "foreign fleet", "internal", "invalid",
    "lost", "misrouted", "no owner", "overflow", "refused", "sink", "too large", "unauthenticated", "unreadable",
})


def reason_class(reason: str) -> str:
    """``"fenced"`` for ``"fenced: epoch 0 ..."`` (the metric label): one of :data:`REASON_CLASSES`,
    or ``"other"`` for any other reason, so the label stays a bounded set whatever a reason holds."""
    word = reason.split(":", 1)[0]
    return word if word in REASON_CLASSES else "other"
