"""Errors of the Kafka layer: what broker and client errors become at its one boundary.

::

    TurnlogError
    └── BrokerError                        (code: librdkafka error code, retriable)
        ├── BrokerUnavailableError         no broker or coordinator answered in time (retry later)
        ├── BrokerConfigurationError       also a ConfigurationError: a client setting, TLS file or
        │                                  credential the client or the broker refused
        ├── UnknownTopicError              the topic or partition does not exist
        ├── TopicAlreadyExistsError        create_topics found it there already
        └── RecordRefusedError             the producer refused this record for good (too large, ...)
"""

from __future__ import annotations

from turnlog.exceptions import ConfigurationError, TurnlogError

__all__ = [
    "BrokerError",
    "BrokerUnavailableError",
    "BrokerConfigurationError",
    "UnknownTopicError",
    "TopicAlreadyExistsError",
    "RecordRefusedError",
]


class BrokerError(TurnlogError):
    """A Kafka client or broker error. ``code`` is librdkafka's error code (None when the
    client gave none); ``retriable`` is librdkafka's own verdict or turnlog's list of
    transient conditions (see ``turnlog.kafka.client_errors``)."""

    def __init__(self, message: str, *, code: int | None = None, retriable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retriable = retriable


class BrokerUnavailableError(BrokerError):
    """No broker, leader or group coordinator answered in time; retrying later can succeed
    (``retriable`` unless the client said otherwise)."""

    def __init__(self, message: str, *, code: int | None = None, retriable: bool = True) -> None:
        super().__init__(message, code=code, retriable=retriable)


class BrokerConfigurationError(BrokerError, ConfigurationError):
    """The client refused a setting (a bad key or TLS file), or the broker refused the
    credentials or this principal's access: fix the ``TURNLOG_KAFKA_*`` settings."""


class UnknownTopicError(BrokerError):
    """The topic or partition does not exist (create topics with ``turnlog topics create``)."""


class TopicAlreadyExistsError(BrokerError):
    """The topic to create exists already."""


class RecordRefusedError(BrokerError):
    """The producer refused the record itself (too large, an unknown partition): sending it
    again fails the same way."""
