"""Which partition a session lives on (the producers' name for ``turnlog.kafka.partitioning``)."""

from __future__ import annotations

from turnlog.kafka.partitioning import partition_for

__all__ = ["partition_for"]
