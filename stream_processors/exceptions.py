"""Errors of the stream processors."""

from __future__ import annotations

from turnlog.exceptions import TurnlogError

__all__ = ["ServiceError"]


class ServiceError(TurnlogError):
    """A stream processor cannot start or keep running (bad topics, no broker)."""
