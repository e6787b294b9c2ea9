"""turnlog: crash-safe, incremental persistence for long-lived agent sessions.

The public API for agents is :class:`SessionRecorder`; services and operator
tools are started with the ``turnlog`` command line.
"""

from turnlog.exceptions import ConfigurationError, TurnlogError
from turnlog.producers import (
    DeliveryError,
    InvalidTurnError,
    RecordedSession,
    RecorderError,
    ResumeBarrierTimeout,
    SessionClosedError,
    SessionNotFoundError,
    SessionRecorder,
)
from turnlog.schemas import EventValidationError, SessionEnded, SessionStarted, ToolCall, TurnCompleted, TurnPartial
from turnlog.settings import TurnlogSettings

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "DeliveryError",
    "EventValidationError",
    "InvalidTurnError",
    "RecordedSession",
    "RecorderError",
    "ResumeBarrierTimeout",
    "SessionClosedError",
    "SessionEnded",
    "SessionNotFoundError",
    "SessionRecorder",
    "SessionStarted",
    "ToolCall",
    "TurnCompleted",
    "TurnPartial",
    "TurnlogError",
    "TurnlogSettings",
    "__version__",
]
