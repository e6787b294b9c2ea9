"""The one boundary where database driver errors become turnlog's own classes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError, StatementError

from turnlog.sinks.exceptions import RecordRejectedError, StoreError, StoreUnavailableError

__all__ = ["store_errors", "RETRYABLE_SQLSTATE_CLASSES", "REJECTING_SQLSTATE_CLASSES"]

# SQLSTATE classes worth retrying: connection exception, transaction rollback
# (serialization failure, deadlock), operator intervention (server shutdown).
RETRYABLE_SQLSTATE_CLASSES = frozenset({"08", "40", "57"})
# Data exception, integrity constraint violation: the same rows fail again.
REJECTING_SQLSTATE_CLASSES = frozenset({"22", "23"})


@contextmanager
def store_errors() -> Iterator[None]:
    """Convert driver errors at the store boundary (``from`` the original).

    Retryable ones (connection, rollback, shutdown) become
    :class:`StoreUnavailableError`; data and integrity errors (SQLSTATE classes
    22 and 23) become :class:`RecordRejectedError`; every other driver error
    (a missing table, a permission, an internal error) becomes a plain
    :class:`StoreError` naming its class and SQLSTATE only. Decided by exception
    class and SQLSTATE, never by message text. Errors that are not the driver's
    pass through unchanged.
    """
    try:
        yield
    except DBAPIError as e:
        sqlstate = (getattr(e.orig, "sqlstate", None) or "")[:2]
        if isinstance(e, OperationalError) or e.connection_invalidated or sqlstate in RETRYABLE_SQLSTATE_CLASSES:
            raise StoreUnavailableError(f"store unavailable: {e.orig}") from e
        if isinstance(e, (DataError, IntegrityError)) or sqlstate in REJECTING_SQLSTATE_CLASSES:
            raise RecordRejectedError(f"store refused the rows: {e.orig}", getattr(e.orig, "sqlstate", None)) from e
        code = getattr(e.orig, "sqlstate", None)
        raise StoreError(f"store error: {type(e.orig).__name__}" + (f" (SQLSTATE {code})" if code else "")) from e
    except StatementError as e:
        # A value the driver or a column type could not bind (before any SQL ran).
        if isinstance(e.orig, (ValueError, OverflowError, TypeError, UnicodeError)):
            raise RecordRejectedError(f"store cannot bind a value: {e.orig!r}") from e
        raise StoreError(f"store error: {type(e.orig).__name__} before the statement ran") from e
