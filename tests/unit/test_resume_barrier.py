"""The resume barrier's store steps (no broker: the barrier's Kafka lookups are not made or are stubbed)."""

from __future__ import annotations

import datetime as dt
import time

import msgspec
import pytest
from prometheus_client import REGISTRY

from turnlog import resume_barrier
from turnlog.producers.exceptions import ResumeBarrierTimeout, SessionErasedError
from turnlog.resume_barrier import ResumeBarrier
from turnlog.schemas.erasure import Erasure
from turnlog.settings import TurnlogSettings
from turnlog.sinks import StoreError, StoreUnavailableError, open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.sinks.reads import get_session

from tests.support import EventFactory, messages


def barrier(url: str) -> ResumeBarrier:
    return ResumeBarrier(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), open_store(url))


def test_the_store_step_is_retried_while_the_store_is_away(tmp_path):
    calls = []

    def work(writes):
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise StoreUnavailableError("store unavailable: connection refused")
        writes.ping()
        return 42

    assert barrier(f"sqlite:///{tmp_path / 'store.db'}")._in_store(time.monotonic() + 10, work) == 42
    assert len(calls) == 3
    assert calls[2] - calls[0] >= 2 * resume_barrier.POLL_INTERVAL_SECONDS * 0.9  # it waited between the tries


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

    def work(writes):
        calls.append(1)
        raise StoreError("schema is older")

    with pytest.raises(StoreError, match="schema is older"):
        barrier(f"sqlite:///{tmp_path / 'store.db'}")._in_store(time.monotonic() + 10, work)
    assert calls == [1]


# -- the scope and the status come before the barrier's work ----------------------------------
def recorded_store(tmp_path):
    """A store with an ended session and an active one of fleet-a (the barrier's Kafka steps are stubbed)."""
    store = open_store(f"sqlite:///{tmp_path / 'scoped.db'}")
    upgrade_to_head(store.engine)
    ended, active = EventFactory("ended-a"), EventFactory("active-a")
    events = [msgspec.structs.replace(ended.started(), fleet="fleet-a"), ended.completed(1, 0, "hello"), ended.ended(2),
              msgspec.structs.replace(active.started(), fleet="fleet-a")]
    events += [active.completed(seq, seq - 1, f"turn {seq - 1}") for seq in range(1, 6)]
    with store.engine.begin() as conn:
        store.apply_batch(conn, None, messages(events))
    return store


def test_a_session_the_token_sees_closed_is_answered_without_the_barrier_and_hidden_ones_look_missing(
    tmp_path, monkeypatch
):
    store = recorded_store(tmp_path)
    passed: list[str] = []
    gate = ResumeBarrier(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), store)
    monkeypatch.setattr(gate, "_catch_up", lambda session_id, deadline: passed.append(session_id))

    closed = gate.grant("ended-a", 5, fleets={"fleet-a"})
    assert closed is not None and closed.status in ("ended", "finalized") and not closed.resumable
    assert passed == []  # its status can only move on: no barrier work for it

    # Another fleet's session and a missing one: the same answer, both after the barrier.
    assert gate.grant("ended-a", 5, fleets={"fleet-b"}) is None
    assert gate.grant("no-such-session", 5, fleets={"fleet-b"}) is None
    assert passed == ["ended-a", "no-such-session"]

    granted = gate.grant("active-a", 5, fleets={"fleet-a"}, turn_limit=2)
    assert granted.resumable and passed[-1] == "active-a"
    assert [t.turn_index for t in granted.turns] == [0, 1] and granted.next_after_turn == 1
    assert granted.max_turn_index == 4
    whole = gate.grant("active-a", 5, fleets={"fleet-a"})  # the direct path: every turn
    assert [t.turn_index for t in whole.turns] == [0, 1, 2, 3, 4] and whole.next_after_turn is None
    store.engine.dispose()


def test_a_session_being_forgotten_is_refused_before_any_claim_or_read(tmp_path, monkeypatch):
    # The direct-store path answers as the API does (410): no new epoch, no turns handed out.
    store = recorded_store(tmp_path)
    with store.engine.begin() as conn:
        store.erasures.request(conn, Erasure(session_id="active-a", fleet="fleet-a", requested_by="cli:test",
                                             requested_at=dt.datetime.now(dt.UTC)))
        epoch_before = get_session(conn, "active-a", fleets=None)["epoch"]
    gate = ResumeBarrier(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), store)
    monkeypatch.setattr(gate, "_catch_up", lambda session_id, deadline: None)
    erased_before = resume_count("erased")
    with pytest.raises(SessionErasedError) as refused:
        gate.grant("active-a", 5, fleets={"fleet-a"})
    assert refused.value.session_id == "active-a"
    assert resume_count("erased") == erased_before + 1
    with pytest.raises(SessionErasedError):
        gate.wait("active-a", 5)  # the barrier's claim without turns refuses it too
    with store.engine.connect() as conn:
        assert get_session(conn, "active-a", fleets=None)["epoch"] == epoch_before  # nothing claimed
    assert gate.grant("active-a", 5, fleets={"fleet-b"}) is None  # another fleet's: as if missing
    store.engine.dispose()


# -- every grant is recorded in turnlog_resume_seconds by its outcome -------------------------
def resume_count(outcome: str) -> float:
    return REGISTRY.get_sample_value("turnlog_resume_seconds_count", {"outcome": outcome}) or 0.0


def test_each_grant_is_recorded_once_with_its_outcome(tmp_path, monkeypatch):
    store = recorded_store(tmp_path)
    with store.engine.begin() as conn:
        store.erasures.request(conn, Erasure(session_id="forgotten-a", fleet="fleet-a", requested_by="cli:test",
                                             requested_at=dt.datetime.now(dt.UTC)))
    gate = ResumeBarrier(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), store)
    monkeypatch.setattr(gate, "_catch_up", lambda session_id, deadline: None)
    before = {outcome: resume_count(outcome) for outcome in resume_barrier.RESUME_OUTCOMES}

    assert gate.grant("active-a", 5).resumable  # granted
    assert not gate.grant("ended-a", 5).resumable  # refused: no longer active
    assert gate.grant("no-such-session", 5) is None  # refused: unknown
    assert gate.grant("forgotten-a", 5) is None  # erased: gone from the store, its erasure kept

    def stuck(session_id, deadline):
        raise ResumeBarrierTimeout("the sink did not catch up")

    monkeypatch.setattr(gate, "_catch_up", stuck)
    with pytest.raises(ResumeBarrierTimeout):
        gate.grant("active-a", 5)

    def broken(session_id, deadline):
        raise RuntimeError("a bug")

    monkeypatch.setattr(gate, "_catch_up", broken)
    with pytest.raises(RuntimeError):
        gate.grant("active-a", 5)
    after = {outcome: resume_count(outcome) - before[outcome] for outcome in resume_barrier.RESUME_OUTCOMES}
    assert after == {"granted": 1, "refused": 2, "erased": 1, "timeout": 1, "error": 1}
    store.engine.dispose()
