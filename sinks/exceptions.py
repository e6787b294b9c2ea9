"""Errors of the store and the sink."""

from __future__ import annotations

from turnlog.exceptions import TurnlogError

__all__ = ["StoreError", "StoreUnavailableError", "RecordRejectedError", "UnsupportedDatabaseError"]


class StoreError(TurnlogError):
    """Base of store errors."""


class StoreUnavailableError(StoreError):
    """The database did not answer or refused the connection (retryable)."""


class UnsupportedDatabaseError(StoreError):
    """The database URL names a backend turnlog has no store for."""


class RecordRejectedError(StoreError):
    """The database refused the rows for a reason retrying cannot fix (a data
    or integrity error); ``sqlstate`` is the SQLSTATE code when the driver gave one."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
