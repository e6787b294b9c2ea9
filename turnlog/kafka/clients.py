"""Client factories: every consumer, producer and admin client turnlog makes.

Each one gets the connection of :func:`turnlog.kafka.config.client_config`, has
librdkafka's log lines routed to this module's logger, and converts the client's
construction errors (a bad setting or TLS file) at the layer's boundary. No
network I/O happens here: librdkafka connects in the background.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from turnlog.kafka.client_errors import broker_errors, to_broker_error
from turnlog.kafka.config import client_config, consumer_config, producer_config
from turnlog.kafka.exceptions import RecordRefusedError
from turnlog.settings import TurnlogSettings

__all__ = ["consumer", "producer", "admin", "producer_from_config", "produce"]

logger = logging.getLogger(__name__)


def consumer(settings: TurnlogSettings, *, group_id: str, **overrides: Any) -> Consumer:
    """A consumer of group ``group_id`` with auto-commit off; ``overrides`` are librdkafka
    keys on top (pass dotted keys as ``**{"auto.offset.reset": "earliest"}``).

    Raises:
        BrokerConfigurationError: librdkafka refused a setting.
    """
    config = {"logger": logger, **consumer_config(settings, group_id=group_id), **overrides}
    with broker_errors("creating a Kafka consumer"):
        return Consumer(config)


def producer(
    settings: TurnlogSettings,
    *,
    client_id: str,
    idempotent: bool = True,
    delivery_timeout_seconds: float | None = None,
    **overrides: Any,
) -> Producer:
    """A producer with :func:`~turnlog.kafka.config.producer_config`'s settings
    (idempotent, ``acks=all``, murmur2) and ``overrides`` on top.

    Raises:
        BrokerConfigurationError: librdkafka refused a setting.
    """
    config = producer_config(
        settings, client_id=client_id, idempotent=idempotent, delivery_timeout_seconds=delivery_timeout_seconds
    )
    return producer_from_config({**config, **overrides})


def producer_from_config(config: Mapping[str, Any]) -> Producer:
    """A producer from a config made by :func:`~turnlog.kafka.config.producer_config`
    (copied, never changed), for holders that keep the config to make a replacement.

    Raises:
        BrokerConfigurationError: librdkafka refused a setting.
    """
    with broker_errors("creating a Kafka producer"):
        return Producer({"logger": logger, **config})


def admin(settings: TurnlogSettings, **overrides: Any) -> AdminClient:
    """An admin client (topics, consumer groups, offsets lookups).

    Raises:
        BrokerConfigurationError: librdkafka refused a setting.
    """
    with broker_errors("creating a Kafka admin client"):
        config: dict[str, Any] = {"logger": logger, **client_config(settings), **overrides}  # a logger is no str
        return AdminClient(config)


def produce(client: Producer, topic: str, value: bytes | None, *, key: bytes | None = None, **kwargs: Any) -> None:
    """``client.produce(topic, value, key, **kwargs)`` (``on_delivery``, ``partition``,
    ``headers``), with the client's synchronous refusal converted.

    Raises:
        BufferError: librdkafka's local queue is full (poll, then try again).
        RecordRefusedError: the client refused this record itself (too large, an
            unknown topic or partition); ``code`` says which. Sending it again fails alike.
    """
    try:
        client.produce(topic, value=value, key=key, **kwargs)
    except KafkaException as e:
        refused = to_broker_error(e, f"producing to {topic}")
        raise RecordRefusedError(str(refused), code=refused.code, retriable=False) from e
