"""Errors of the event model."""

from __future__ import annotations

from turnlog.exceptions import TurnlogError

__all__ = ["SchemaError", "EventValidationError"]


class SchemaError(TurnlogError):
    """Base of event-model errors."""


class EventValidationError(SchemaError):
    """Bytes or values that are not a valid v1 event.

    ``reason`` is a short, human-readable cause (it travels to the DLQ as the
    ``turnlog-reason`` header).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
