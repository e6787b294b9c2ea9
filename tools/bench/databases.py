"""The bench's own Postgres databases: made for a phase, dropped after it.

A database is dropped ``WITH (FORCE)``, which ends its connections; one of them may be
an autovacuum worker that the run's writes started, which a non-superuser may not end
(``InsufficientPrivilege``) and which ends by itself within seconds. The drop is tried
again until then; one that never succeeds is reported, never raised: a run's figures are
written whatever its cleanup does.
"""

from __future__ import annotations

import time

import psycopg

__all__ = ["create_database", "drop_database", "DROP_PATIENCE_SECONDS"]

#: How long a drop is tried again while another role's process (autovacuum) holds the database.
DROP_PATIENCE_SECONDS = 60.0
_RETRY_SECONDS = 1.0


def create_database(admin_dsn: str, database: str) -> None:
    """``CREATE DATABASE database`` through ``admin_dsn`` (a psycopg DSN).

    Raises:
        psycopg.Error: Postgres refused it.
    """
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')


def drop_database(admin_dsn: str, database: str, *, patience: float = DROP_PATIENCE_SECONDS) -> bool:
    """Drop ``database`` if it exists, ending its connections; True once it is gone. Tried again
    for up to ``patience`` seconds while a process the bench's role may not end holds it;
    False (and a line printed that names the database) if it could not be dropped."""
    deadline = time.monotonic() + patience
    while True:
        try:
            with psycopg.connect(admin_dsn, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            return True
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ObjectInUse) as e:
            if time.monotonic() >= deadline:
                print(f"bench: could not drop database {database} ({type(e).__name__}); drop it by hand")
                return False
            time.sleep(_RETRY_SECONDS)
