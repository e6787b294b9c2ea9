"""The SQLite store: WAL mode, the embedded default.

Several processes (sink, finalizer, resume barrier) share one database file, so
every transaction starts with ``BEGIN IMMEDIATE``: it takes the write lock up
front instead of failing on a read-to-write upgrade, and ``busy_timeout`` makes
writers queue rather than error.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.sql import Select

from turnlog.sinks.base import SqlStore

__all__ = ["SqliteStore"]

BUSY_TIMEOUT_MS = 30_000


class SqliteStore(SqlStore):
    """:class:`SqlStore` on SQLite in WAL mode; writers are serialized by the database lock."""

    @classmethod
    def from_url(cls, url: str, **engine_options: Any) -> SqliteStore:
        engine: Engine = create_engine(url, **{"hide_parameters": True, **engine_options})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # Let SQLAlchemy, not the driver, decide where transactions begin.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return cls(engine)

    def insert(self, table: Any) -> Any:
        return sqlite_insert(table)

    def lock(self, query: Select[Any]) -> Select[Any]:
        return query  # BEGIN IMMEDIATE already holds the database's write lock.
