"""Errors of the event model."""

from __future__ import annotations

from turnlog.exceptions import TurnlogError

__all__ = ["SchemaError", "EventValidationError"]


class SchemaError(TurnlogError):
    """Base of event-model errors."""


class EventValidationError(SchemaError):
    """Bytes or values that are not a valid event (or erasure record).

    ``reason`` is a short, human-readable cause (it travels to the DLQ as the
    ``turnlog-reason`` header, after ``reason_class``: one of turnlog/dlq.py's classes).
    """

    #: The DLQ's class of the refusal (turnlog/dlq.py ``REASON_CLASSES``).
    reason_class: str = "invalid"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
