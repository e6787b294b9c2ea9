"""The DLQ record format shared by every stage that rejects input.

A DLQ record carries the original bytes as its value (and the original key),
and these headers: ``turnlog-reason`` (why, human-readable, UTF-8) and where it
came from, ``turnlog-source-topic``, ``turnlog-source-partition``,
``turnlog-source-offset``. The reason starts with a class word and a colon
(``invalid:``, ``fenced:``, ``sink:``, ...), which the DLQ metric is labelled by.
"""

from __future__ import annotations

__all__ = ["REASON_HEADER", "dlq_headers", "reason_class"]

REASON_HEADER = "turnlog-reason"


def dlq_headers(reason: str, topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    """Kafka headers for a rejected record."""
    return [
        (REASON_HEADER, reason.encode("utf-8")),
        ("turnlog-source-topic", topic.encode("utf-8")),
        ("turnlog-source-partition", str(partition).encode()),
        ("turnlog-source-offset", str(offset).encode()),
    ]


def reason_class(reason: str) -> str:
    """``"fenced"`` for ``"fenced: epoch 0 ..."`` (the metric label)."""
    return reason.split(":", 1)[0]
