"""turnlog: crash-safe, incremental persistence for long-lived agent sessions.

The public API for agents is :class:`SessionRecorder`; services and operator
tools are started with the ``turnlog`` command line.

The names below are loaded on first use (PEP 562), so importing a subpackage
(``import turnlog.schemas``) does not load the recorder, its Kafka clients or
SQLAlchemy; ``from turnlog import SessionRecorder`` works as usual.
"""

import importlib
import typing

if typing.TYPE_CHECKING:
    from turnlog.exceptions import ConfigurationError, TurnlogError
    from turnlog.producers import (
        InvalidTurnError,
        RecordedSession,
        RecorderError,
        ResumeApiError,
        ResumeBarrierTimeout,
        ResumeUnauthorizedError,
        SessionClosedError,
        SessionErasedError,
        SessionNotFoundError,
        SessionRecorder,
        SpoolError,
        SpoolFullError,
    )
    from turnlog.schemas import (
        EventValidationError,
        SessionEnded,
        SessionStarted,
        ToolCall,
        TurnCompleted,
        TurnPartial,
    )
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
    "SessionErasedError",
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

#: Where each public name is defined (the imports under TYPE_CHECKING above, for type checkers).
_SOURCES = {
    "turnlog.exceptions": ("ConfigurationError", "TurnlogError"),
    "turnlog.producers": (
        "InvalidTurnError",
        "RecordedSession",
        "RecorderError",
        "ResumeApiError",
        "ResumeBarrierTimeout",
        "ResumeUnauthorizedError",
        "SessionClosedError",
        "SessionErasedError",
        "SessionNotFoundError",
        "SessionRecorder",
        "SpoolError",
        "SpoolFullError",
    ),
    "turnlog.schemas": (
        "EventValidationError",
        "SessionEnded",
        "SessionStarted",
        "ToolCall",
        "TurnCompleted",
        "TurnPartial",
    ),
    "turnlog.settings": ("TurnlogSettings",),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}


# Hidden from type checkers: they see the imports above, so a misspelt name stays an error.
if not typing.TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        module = _MODULE_OF.get(name)
        if module is None:
            raise AttributeError(f"module 'turnlog' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # loaded once; later lookups do not come here
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})
