"""The idempotent producer's settings, shared by the recorder's spool drainer and the services."""

from __future__ import annotations

from typing import Any

__all__ = ["idempotent_config"]


def idempotent_config(bootstrap_servers: str, *, client_id: str, delivery_timeout_seconds: float) -> dict[str, Any]:
    """The producer settings DESIGN.md requires: idempotence, ``acks=all``,
    and the murmur2 partitioner (the Java client's, so both agree on partitions)."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "compression.type": "lz4",
        "delivery.timeout.ms": int(delivery_timeout_seconds * 1000),
    }
