"""The resume barrier's store step (no broker: the barrier's Kafka lookups are not made)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from turnlog.producers import resume
from turnlog.producers.exceptions import ResumeBarrierTimeout
from turnlog.producers.resume import ResumeBarrier
from turnlog.settings import TurnlogSettings
from turnlog.sinks import StoreError, StoreUnavailableError, open_store


def barrier(url: str) -> ResumeBarrier:
    return ResumeBarrier(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), open_store(url))


def test_the_store_step_is_retried_while_the_store_is_away(tmp_path):
    calls = []

    def work(conn):
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise StoreUnavailableError("store unavailable: connection refused")
        return conn.execute(text("select 42")).scalar_one()

    assert barrier(f"sqlite:///{tmp_path / 'store.db'}")._in_store(time.monotonic() + 10, work) == 42
    assert len(calls) == 3
    assert calls[2] - calls[0] >= 2 * resume.POLL_INTERVAL_SECONDS * 0.9  # it waited between the tries


def test_a_store_away_past_the_deadline_is_a_barrier_timeout(tmp_path):
    """A real driver error: SQLite cannot open a file in a folder that does not exist."""
    calls = []
    began = time.monotonic()
    with pytest.raises(ResumeBarrierTimeout, match="the store did not answer") as raised:
        barrier(f"sqlite:///{tmp_path / 'missing' / 'store.db'}")._in_store(began + 0.3, calls.append)
    assert isinstance(raised.value.__cause__, StoreUnavailableError)
    assert 0.3 <= time.monotonic() - began < 5
    assert calls == []  # the transaction never began


def test_other_store_errors_are_not_retried(tmp_path):
    calls = []

    def work(conn):
        calls.append(1)
        raise StoreError("schema is older")

    with pytest.raises(StoreError, match="schema is older"):
        barrier(f"sqlite:///{tmp_path / 'store.db'}")._in_store(time.monotonic() + 10, work)
    assert calls == [1]
