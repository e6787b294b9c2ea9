"""The one boundary where database driver errors become turnlog's own classes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DBAPIError, OperationalError

from turnlog.sinks.exceptions import StoreUnavailableError

__all__ = ["store_errors", "RETRYABLE_SQLSTATE_CLASSES"]

# SQLSTATE classes worth retrying: connection exception, transaction rollback
# (serialization failure, deadlock), operator intervention (server shutdown).
RETRYABLE_SQLSTATE_CLASSES = frozenset({"08", "40", "57"})


@contextmanager
def store_errors() -> Iterator[None]:
    """Re-raise retryable driver errors as :class:`StoreUnavailableError` (``from`` the original).

    Decided by exception class and SQLSTATE, never by message text. Other
    errors pass through unchanged.
    """
    try:
        yield
    except DBAPIError as e:
        sqlstate = (getattr(e.orig, "sqlstate", None) or "")[:2]
        if isinstance(e, OperationalError) or e.connection_invalidated or sqlstate in RETRYABLE_SQLSTATE_CLASSES:
            raise StoreUnavailableError(f"store unavailable: {e.orig}") from e
        raise
