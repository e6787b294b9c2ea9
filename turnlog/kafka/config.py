"""One connection config for every Kafka client turnlog makes.

librdkafka (confluent-kafka) takes :func:`client_config`; Faust (aiokafka) takes
the same settings as credentials (``turnlog.kafka.faust_auth``). Both come from
the ``TURNLOG_KAFKA_*`` settings, so TLS or SASL is switched on in one place.

The dicts returned here hold secrets in plain text (librdkafka needs them so):
pass them to a client, never to a logger.
"""

from __future__ import annotations

import ssl
from typing import Any

from turnlog.settings import TurnlogSettings

__all__ = ["client_config", "producer_config", "consumer_config", "IDEMPOTENT_PRODUCER", "ssl_context"]

#: What docs/design.md requires of every producer that writes turnlog's topics:
#: idempotence, ``acks=all``, and the murmur2 partitioner (the Java client's, so
#: both agree on partitions); small batches (5 ms) compressed with lz4.
IDEMPOTENT_PRODUCER: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "partitioner": "murmur2_random",
    "linger.ms": 5,
    "compression.type": "lz4",
}


def client_config(settings: TurnlogSettings) -> dict[str, Any]:
    """librdkafka's connection settings: ``bootstrap.servers``, ``security.protocol``
    and, where set, the SASL and TLS keys. A new dict on each call (callers may add to it).

    For PLAINTEXT it is ``{"bootstrap.servers": ..., "security.protocol": "PLAINTEXT"}``.
    """
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "security.protocol": settings.kafka_security_protocol,
    }
    if settings.kafka_sasl_mechanism is not None:
        config["sasl.mechanism"] = settings.kafka_sasl_mechanism
    if settings.kafka_sasl_username is not None:
        config["sasl.username"] = settings.kafka_sasl_username
    if settings.kafka_sasl_password is not None:
        config["sasl.password"] = settings.kafka_sasl_password.get_secret_value()
    if settings.kafka_ssl_ca_location is not None:
        config["ssl.ca.location"] = settings.kafka_ssl_ca_location
    if settings.kafka_ssl_certificate_location is not None:
        config["ssl.certificate.location"] = settings.kafka_ssl_certificate_location
    if settings.kafka_ssl_key_location is not None:
        config["ssl.key.location"] = settings.kafka_ssl_key_location
    if settings.kafka_ssl_key_password is not None:
        config["ssl.key.password"] = settings.kafka_ssl_key_password.get_secret_value()
    return config


def producer_config(
    settings: TurnlogSettings,
    *,
    client_id: str,
    idempotent: bool = True,
    delivery_timeout_seconds: float | None = None,
) -> dict[str, Any]:
    """A producer's librdkafka settings: the connection, :data:`IDEMPOTENT_PRODUCER`
    (without ``enable.idempotence`` when ``idempotent`` is false) and
    ``delivery.timeout.ms`` (``delivery_timeout_seconds``, default
    ``settings.delivery_timeout_seconds``)."""
    seconds = settings.delivery_timeout_seconds if delivery_timeout_seconds is None else delivery_timeout_seconds
    config = {**client_config(settings), "client.id": client_id, **IDEMPOTENT_PRODUCER}
    if not idempotent:
        del config["enable.idempotence"]
    config["delivery.timeout.ms"] = int(seconds * 1000)
    return config


def consumer_config(settings: TurnlogSettings, *, group_id: str) -> dict[str, Any]:
    """A consumer's librdkafka settings: the connection, ``group.id`` and no automatic
    offset commits (turnlog commits or stores offsets only after the work they cover)."""
    return {**client_config(settings), "group.id": group_id, "enable.auto.commit": False}


def ssl_context(settings: TurnlogSettings) -> ssl.SSLContext:
    """A TLS client context from the ``TURNLOG_KAFKA_SSL_*`` settings (server certificates
    verified against ``kafka_ssl_ca_location`` or the system's trust store), for aiokafka."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=settings.kafka_ssl_ca_location)
    if settings.kafka_ssl_certificate_location is not None:
        password = settings.kafka_ssl_key_password
        context.load_cert_chain(
            settings.kafka_ssl_certificate_location,
            settings.kafka_ssl_key_location,
            password.get_secret_value() if password is not None else None,
        )
    return context
