"""Fixtures: the real broker and the real Postgres, from the environment.

The services come from ``deploy/services.sh start`` (or any broker and Postgres
named by ``TURNLOG_TEST_BOOTSTRAP_SERVERS`` / ``TURNLOG_TEST_DATABASE_URL``).
Where neither answers but a Docker engine does, testcontainers starts them.
With neither, integration tests fail with a message saying how to start them:
they never skip.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from turnlog.kafka import broker_answers
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore, open_store
from turnlog.sinks.migrate import upgrade_to_head

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_DATABASE_URL = "postgresql+psycopg://turnlog:turnlog@127.0.0.1:5433/turnlog"
HOW_TO_START = "start them with `bash deploy/services.sh start` (or set TURNLOG_TEST_BOOTSTRAP_SERVERS / TURNLOG_TEST_DATABASE_URL)"


def _docker_engine_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    bootstrap = os.environ.get("TURNLOG_TEST_BOOTSTRAP_SERVERS", DEFAULT_BOOTSTRAP)
    if broker_answers(TurnlogSettings(bootstrap_servers=bootstrap)):
        yield bootstrap
        return
    if _docker_engine_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    pytest.fail(f"no Kafka broker answers at {bootstrap} and no Docker engine is available: {HOW_TO_START}", pytrace=False)


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    url = os.environ.get("TURNLOG_TEST_DATABASE_URL", DEFAULT_DATABASE_URL)
    try:
        with create_engine(url).connect() as conn:
            conn.execute(text("select 1"))
        yield url
        return
    except OperationalError:
        pass
    if _docker_engine_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:15", driver="psycopg") as pg:
            yield pg.get_connection_url()
        return
    pytest.fail(f"no Postgres answers at {make_url(url).render_as_string()} and no Docker engine is available: {HOW_TO_START}", pytrace=False)


class PostgresDatabases:
    """Creates throwaway databases (one per test or fixture) and drops them at the end."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.created: list[str] = []

    def create(self) -> str:
        name = f"turnlog_test_{uuid.uuid4().hex[:12]}"
        engine = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        engine.dispose()
        self.created.append(name)
        return make_url(self.admin_url).set(database=name).render_as_string(hide_password=False)

    def drop_all(self) -> None:
        engine = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            for name in self.created:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


@pytest.fixture(scope="session")
def postgres_databases(postgres_admin_url: str) -> Iterator[PostgresDatabases]:
    databases = PostgresDatabases(postgres_admin_url)
    yield databases
    databases.drop_all()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    """A migrated, empty store on each backend (the contract tests run on both)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
    else:
        url = request.getfixturevalue("postgres_databases").create()
    store = open_store(url)
    upgrade_to_head(store.engine)
    yield store
    store.engine.dispose()
