"""The Postgres store (psycopg 3)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql import Select

from turnlog.sinks.base import SqlStore

__all__ = ["PostgresStore"]


class PostgresStore(SqlStore):
    """:class:`SqlStore` on Postgres: ``ON CONFLICT`` upserts and ``FOR UPDATE`` locks."""

    @classmethod
    def from_url(cls, url: str, **engine_options: Any) -> PostgresStore:
        engine: Engine = create_engine(url, pool_pre_ping=True, **engine_options)
        return cls(engine)

    def insert(self, table: Any) -> Any:
        return pg_insert(table)

    def lock(self, query: Select[Any]) -> Select[Any]:
        return query.with_for_update()
