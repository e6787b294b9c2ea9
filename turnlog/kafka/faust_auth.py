"""The connection settings of ``turnlog.kafka.config`` in Faust's terms (aiokafka).

A module of its own so that importing the Kafka layer does not import Faust.
"""

from __future__ import annotations

import faust

from turnlog.kafka.config import ssl_context
from turnlog.settings import TurnlogSettings

__all__ = ["faust_credentials"]


def faust_credentials(settings: TurnlogSettings) -> faust.types.auth.CredentialsT | None:
    """Faust's ``broker_credentials`` for ``settings``: None for PLAINTEXT (Faust's default),
    :class:`faust.SSLCredentials` for SSL, :class:`faust.SASLCredentials` for the SASL
    protocols (with a TLS context for SASL_SSL)."""
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return faust.SSLCredentials(ssl_context(settings))
    password = settings.kafka_sasl_password
    return faust.SASLCredentials(
        username=settings.kafka_sasl_username,
        password=password.get_secret_value() if password is not None else None,
        mechanism=settings.kafka_sasl_mechanism,
        ssl_context=ssl_context(settings) if protocol == "SASL_SSL" else None,
    )
