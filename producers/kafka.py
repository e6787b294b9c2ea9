"""Deprecated: the producer settings moved to the Kafka layer (``turnlog.kafka``).

Kept only for callers not migrated yet (``core/bench/baselines.py``); use
:func:`turnlog.kafka.producer_config` or :func:`turnlog.kafka.producer`, which
also carry the ``TURNLOG_KAFKA_*`` security settings.
"""

from __future__ import annotations

from typing import Any

from turnlog.kafka.config import IDEMPOTENT_PRODUCER

__all__ = ["idempotent_config"]


def idempotent_config(bootstrap_servers: str, *, client_id: str, delivery_timeout_seconds: float) -> dict[str, Any]:
    """:data:`turnlog.kafka.IDEMPOTENT_PRODUCER` for a PLAINTEXT connection to ``bootstrap_servers``."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": client_id,
        **IDEMPOTENT_PRODUCER,
        "delivery.timeout.ms": int(delivery_timeout_seconds * 1000),
    }
