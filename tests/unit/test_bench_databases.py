"""The bench drops its databases through an autovacuum worker it may not end, and never loses a
run's report to its cleanup (``tools/bench/databases.py``)."""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
import pytest

from turnlog.tools.bench import databases


class _Postgres:
    """``psycopg.connect`` whose DROP is refused ``refusals`` times (autovacuum holds the database)."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.statements: list[str] = []

    @contextlib.contextmanager
    def connect(self, _dsn: str, **_options: Any):
        yield self

    def execute(self, statement: str) -> None:
        self.statements.append(statement)
        if self.refusals:
            self.refusals -= 1
            raise psycopg.errors.InsufficientPrivilege("must be a member of the role whose process is being terminated")


@pytest.fixture
def postgres(monkeypatch: pytest.MonkeyPatch):
    def make(refusals: int) -> _Postgres:
        fake = _Postgres(refusals)
        monkeypatch.setattr(databases.psycopg, "connect", fake.connect)
        monkeypatch.setattr(databases, "_RETRY_SECONDS", 0.0)
        return fake
    return make


def test_a_drop_refused_while_autovacuum_holds_the_database_is_tried_again(postgres) -> None:
    fake = postgres(2)
    assert databases.drop_database("dsn", "bench_x") is True
    assert fake.statements == ['DROP DATABASE IF EXISTS "bench_x" WITH (FORCE)'] * 3


def test_a_drop_refused_past_its_patience_is_reported_not_raised(postgres) -> None:
    fake = postgres(10**6)
    assert databases.drop_database("dsn", "bench_y", patience=0.0) is False
    assert len(fake.statements) == 1
