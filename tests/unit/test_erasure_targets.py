"""Which sessions `turnlog forget --fleet F <id>` forgets (sinks/erasure_request.py): the fleet's keyed
session of the agent's id and its bare one from before per-fleet keys, never another fleet's."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import insert

from turnlog.sinks import SqlStore
from turnlog.sinks.erasure_request import _targets_in_fleet
from turnlog.sinks.exceptions import StoreUnavailableError
from turnlog.sinks.tables import sessions

from tests.support import sqlite_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    with sqlite_store(tmp_path / "store.db") as store:
        yield store


def stored(store: SqlStore, *rows: tuple[str, str]) -> None:
    with store.engine.begin() as conn:
        for session_id, fleet in rows:
            conn.execute(insert(sessions).values(id=session_id, fleet=fleet, status="active", epoch=0, last_seq=-1))


def test_an_unstored_id_is_forgotten_under_its_key(store):
    assert _targets_in_fleet(store, "a", "x") == ["a:x"]


def test_a_bare_session_from_before_keys_and_the_keyed_one_are_both_forgotten(store):
    stored(store, ("x", "a"), ("a:x", "a"))
    assert _targets_in_fleet(store, "a", "x") == ["x", "a:x"]


def test_another_fleets_bare_session_of_the_id_is_left_alone(store):
    stored(store, ("x", "b"))
    assert _targets_in_fleet(store, "a", "x") == ["a:x"]


def test_an_argument_in_the_fleets_namespace_is_a_key(store):
    stored(store, ("a:x", "a"))
    assert _targets_in_fleet(store, "a", "a:x") == ["a:x"]


def test_with_the_store_away_both_are_forgotten_bound_to_the_fleet(store, monkeypatch):
    def away(*_args, **_kwargs):
        raise StoreUnavailableError("store away")

    monkeypatch.setattr(store.engine, "connect", away)
    assert _targets_in_fleet(store, "a", "x") == ["a:x", "x"]
