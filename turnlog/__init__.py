"""turnlog: crash-safe, incremental persistence for long-lived agent sessions.

The public API for agents is :class:`SessionRecorder`; services and operator
tools are started with the ``turnlog`` command line.
"""

from turnlog.exceptions import ConfigurationError, TurnlogError
from turnlog.producers import (
    InvalidTurnError,
    RecordedSession,
    RecorderError,
    ResumeApiError,
    ResumeBarrierTimeout,
    ResumeUnauthorizedError,
    SessionClosedError,
    SessionNotFoundError,
    SessionRecorder,
    SpoolError,
    SpoolFullError,
)
from turnlog.schemas import EventValidationError, SessionEnded, SessionStarted, ToolCall, TurnCompleted, TurnPartial
from turnlog.settings import TurnlogSettings

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "EventValidationError",
    "InvalidTurnError",
    "RecordedSession",
    "RecorderError",
    "ResumeApiError",
    "ResumeBarrierTimeout",
    "ResumeUnauthorizedError",
    "SessionClosedError",
    "SessionEnded",
    "SessionNotFoundError",
    "SessionRecorder",
    "SessionStarted",
    "SpoolError",
    "SpoolFullError",
    "ToolCall",
    "TurnCompleted",
    "TurnPartial",
    "TurnlogError",
    "TurnlogSettings",
    "__version__",
]
