"""The records a sink consumes: where each came from, its raw bytes, and where to resume."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["SourceMessage", "next_offsets"]


@dataclass(frozen=True, slots=True)
class SourceMessage:
    """One consumed Kafka record: where it came from, its raw value and key (bytes), and the headers
    its reader needs (the erasure ledger's signature; None where none are kept)."""

    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] | None = None


def next_offsets(messages: Iterable[SourceMessage]) -> dict[tuple[str, int], int]:
    """``{(topic, partition): offset after the last of messages there}``: where to resume."""
    positions: dict[tuple[str, int], int] = {}
    for m in messages:
        key = (m.topic, m.partition)
        positions[key] = max(positions.get(key, 0), m.offset + 1)
    return positions
