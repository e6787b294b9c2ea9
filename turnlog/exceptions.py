"""turnlog's exception tree.

Every error turnlog raises derives from :class:`TurnlogError`. Each subpackage
keeps its own ``exceptions.py``; driver and broker errors are converted to these
classes once, at the boundary, with ``raise ... from e``::

    TurnlogError
    ├── ConfigurationError                 (turnlog.exceptions)
    ├── NotReadyError                      (turnlog.readiness)
    ├── WaitTimeoutError                   (turnlog.polling; also a TimeoutError)
    ├── SchemaError                        (turnlog.schemas.exceptions)
    │   └── EventValidationError
    ├── RecorderError                      (turnlog.producers.exceptions)
    │   ├── InvalidTurnError
    │   ├── SessionClosedError
    │   ├── SpoolError
    │   │   └── SpoolFullError
    │   ├── SessionNotFoundError
    │   ├── ResumeBarrierTimeout
    │   └── ResumeApiError
    │       └── ResumeUnauthorizedError
    ├── StoreError                         (turnlog.sinks.exceptions)
    │   └── StoreUnavailableError
    ├── ServiceError                       (turnlog.stream_processors.exceptions)
    └── BrokerError                        (turnlog.kafka.exceptions)
        ├── BrokerUnavailableError
        ├── BrokerConfigurationError       (also a ConfigurationError)
        ├── UnknownTopicError
        ├── TopicAlreadyExistsError
        └── RecordRefusedError
"""

from __future__ import annotations

__all__ = ["TurnlogError", "ConfigurationError"]


class TurnlogError(Exception):
    """Root of every error raised by turnlog."""


class ConfigurationError(TurnlogError):
    """A setting is missing or has a value turnlog cannot use."""
