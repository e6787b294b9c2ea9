"""The SQL sink: batched idempotent upserts with the consumed offsets in the same transaction."""

from __future__ import annotations

import pydantic
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from turnlog import redact
from turnlog.sinks.base import BatchResult, SessionPosition, SqlStore
from turnlog.sinks.exceptions import StoreError, StoreUnavailableError, UnsupportedDatabaseError
from turnlog.sinks.source_records import SourceMessage

__all__ = [
    "BatchResult",
    "SessionPosition",
    "SourceMessage",
    "SqlStore",
    "StoreError",
    "StoreUnavailableError",
    "UnsupportedDatabaseError",
    "open_store",
    "parse_database_url",
    "safe_url",
]

_EXPECTED = "sqlite:///PATH or postgresql+psycopg://user:password@host:port/db"


def safe_url(url: str | URL | pydantic.SecretStr) -> str:
    """``url`` (a string, a SQLAlchemy URL, or ``settings.database_url``) for messages and logs:
    the password hidden wherever it sits, in the authority or in the query string
    (:func:`turnlog.redact.redact_url`)."""
    return redact.redact_url(url.get_secret_value() if isinstance(url, pydantic.SecretStr) else url)


def parse_database_url(url: str | pydantic.SecretStr) -> URL:
    """``url`` parsed, as a SQLAlchemy ``URL`` (whose ``str`` and ``repr`` hide the password).

    Raises:
        UnsupportedDatabaseError: it does not parse. The message never shows the value: a
            mistyped one may be a password alone, which no redaction can recognise.
    """
    raw = url.get_secret_value() if isinstance(url, pydantic.SecretStr) else url
    try:
        return make_url(raw)
    except ArgumentError:
        problem = "it does not parse"
    except ValueError:  # int() of the port; its message would quote a piece of the URL
        problem = "its port is not a number"
    raise UnsupportedDatabaseError(f"bad database URL, {problem} (expected {_EXPECTED}; the value is not shown)")


def open_store(url: str | pydantic.SecretStr, *, pool_pre_ping: bool = True) -> SqlStore:
    """A store for ``url`` (``sqlite:///PATH`` or ``postgresql+psycopg://...``; a ``SecretStr``
    such as ``settings.database_url`` is unwrapped here, where the engine is made).

    No connection is made here; the engine connects on first use. On Postgres,
    ``pool_pre_ping`` checks each pooled connection at checkout (one round trip
    per transaction), so a connection the server dropped is replaced unseen; a
    caller that retries a transaction failing with ``StoreUnavailableError``
    anyway (the sink) can turn it off.

    Raises:
        UnsupportedDatabaseError: the URL is malformed (the message does not show it) or
            names another backend.
    """
    parsed = parse_database_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        from turnlog.sinks.sqlite import SqliteStore

        return SqliteStore.from_url(url.get_secret_value() if isinstance(url, pydantic.SecretStr) else url)
    if backend == "postgresql":
        from turnlog.sinks.postgres import PostgresStore

        if parsed.drivername == "postgresql":  # plain URL: use psycopg 3, the driver turnlog ships
            parsed = parsed.set(drivername="postgresql+psycopg")
        return PostgresStore.from_url(parsed.render_as_string(hide_password=False), pool_pre_ping=pool_pre_ping)
    raise UnsupportedDatabaseError(f"no turnlog store for {backend!r} (use sqlite:/// or postgresql+psycopg://)")
