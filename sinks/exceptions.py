"""Errors of the store and the sink."""

from __future__ import annotations

from turnlog.exceptions import TurnlogError

__all__ = ["StoreError", "StoreUnavailableError", "UnsupportedDatabaseError"]


class StoreError(TurnlogError):
    """Base of store errors."""


class StoreUnavailableError(StoreError):
    """The database did not answer or refused the connection (retryable)."""


class UnsupportedDatabaseError(StoreError):
    """The database URL names a backend turnlog has no store for."""
