"""The Postgres store (psycopg 3)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Select

from turnlog.sinks.base import SqlStore

__all__ = ["PostgresStore", "IDLE_IN_TRANSACTION_TIMEOUT_MS"]

#: The server ends a transaction whose client has sent nothing for this long (milliseconds). No
#: turnlog transaction waits on its client between statements for more than milliseconds, so only
#: a frozen or cut-off process hits it: its row locks are released (a sink's claim of the partitions
#: waits no longer for them, sinks/offsets.py) and, when it wakes, its commit fails and writes nothing.
#: Equal to the sink's consumer session timeout (sinks/service.py): by the time the group has moved
#: a frozen sink's partitions, the server has dropped that sink's open transaction.
IDLE_IN_TRANSACTION_TIMEOUT_MS = 10_000


class PostgresStore(SqlStore):
    """:class:`SqlStore` on Postgres: ``ON CONFLICT`` upserts, ``FOR UPDATE`` locks and
    pipelined writes."""

    @classmethod
    def from_url(cls, url: str, **engine_options: Any) -> PostgresStore:
        engine: Engine = create_engine(url, **{"pool_pre_ping": True, "hide_parameters": True, **engine_options})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            with dbapi_connection.cursor() as cursor:
                cursor.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_TIMEOUT_MS}")
            dbapi_connection.commit()  # psycopg opened a transaction for the SET: end it

        return cls(engine)

    def insert(self, table: Any) -> Any:
        return pg_insert(table)

    def lock(self, query: Select[Any]) -> Select[Any]:
        return query.with_for_update()

    @contextmanager
    def pipeline(self, conn: Connection) -> Iterator[None]:
        """psycopg's pipeline mode for the block: its statements go out without waiting
        for each result, and the block's end waits once for all of them.

        Only for writes whose results are never read: SQLAlchemy reads a
        statement's result as soon as it runs, and in pipeline mode there is none
        yet. An error the server returns by then is raised at the block's end, as
        the SQLAlchemy ``DBAPIError`` subclass it would have been outside
        (``IntegrityError``, ``DataError``, ``OperationalError``...), so
        ``sinks/driver_errors.store_errors`` classifies it the same way; on a lost
        connection, the connection is invalidated first (a new one is made for
        the next transaction). A libpq without pipeline mode runs the block
        statement by statement.
        """
        driver = conn.connection.driver_connection
        if not isinstance(driver, psycopg.Connection) or not psycopg.Pipeline.is_supported():
            yield
            return
        try:
            with driver.pipeline():
                yield
        except psycopg.Error as e:
            lost = conn.dialect.is_disconnect(e, driver, None)  # type: ignore[arg-type]  # psycopg's own types
            if lost:
                conn.invalidate(e)
            raise DBAPIError.instance(
                None, None, e, psycopg.Error, connection_invalidated=lost, dialect=conn.dialect
            ) from e
