"""The SQL sink: batched idempotent upserts with the consumed offsets in the same transaction."""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from turnlog.sinks.base import BatchResult, SessionPosition, SqlStore
from turnlog.sinks.batch import SourceMessage
from turnlog.sinks.exceptions import StoreError, StoreUnavailableError, UnsupportedDatabaseError

__all__ = [
    "BatchResult",
    "SessionPosition",
    "SourceMessage",
    "SqlStore",
    "StoreError",
    "StoreUnavailableError",
    "UnsupportedDatabaseError",
    "open_store",
    "safe_url",
]


#: Query parameters of a database URL that hold secrets (libpq's and psycopg's names).
_SECRET_PARAMETERS = ("password", "sslpassword", "passfile")


def safe_url(url: str | URL) -> str:
    """``url`` (a string or SQLAlchemy URL) for messages and logs: the password
    hidden wherever it sits, in the authority or in the query string."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        return "<not a database URL>"
    hidden = parsed.set(query={k: ("***" if k in _SECRET_PARAMETERS else v) for k, v in parsed.query.items()})
    return hidden.render_as_string(hide_password=True)


def open_store(url: str, *, pool_pre_ping: bool = True) -> SqlStore:
    """A store for ``url`` (``sqlite:///PATH`` or ``postgresql+psycopg://...``).

    No connection is made here; the engine connects on first use. On Postgres,
    ``pool_pre_ping`` checks each pooled connection at checkout (one round trip
    per transaction), so a connection the server dropped is replaced unseen; a
    caller that retries a transaction failing with ``StoreUnavailableError``
    anyway (the sink) can turn it off.

    Raises:
        UnsupportedDatabaseError: the URL is malformed or names another backend.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise UnsupportedDatabaseError(f"not a database URL: {url!r}") from e
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        from turnlog.sinks.sqlite import SqliteStore

        return SqliteStore.from_url(url)
    if backend == "postgresql":
        from turnlog.sinks.postgres import PostgresStore

        if parsed.drivername == "postgresql":  # plain URL: use psycopg 3, the driver turnlog ships
            parsed = parsed.set(drivername="postgresql+psycopg")
        return PostgresStore.from_url(parsed.render_as_string(hide_password=False), pool_pre_ping=pool_pre_ping)
    raise UnsupportedDatabaseError(f"no turnlog store for {backend!r} (use sqlite:/// or postgresql+psycopg://)")
