"""An erasure is bound to its fleet on the agents' hosts too: a recorder drops what its spool holds
of an id only for the erasure of the fleet those events claim (no broker: the producer points at a
closed port and nothing is delivered)."""

from __future__ import annotations

import datetime as dt

import pytest

from turnlog.kafka import producer_config
from turnlog.producers import SessionErasedError
from turnlog.producers.drainer import SpoolDrainer
from turnlog.producers.recorder import SessionRecorder
from turnlog.producers.spool import SpooledEvent
from turnlog.schemas.erasure import Erasure
from turnlog.settings import TurnlogSettings
from turnlog.signing import claim_headers

from tests.support import wait_until


def spooled(seq: int, fleet: str) -> SpooledEvent:
    return SpooledEvent("t.events", b"X", b"words", "X", seq, headers=tuple(claim_headers(fleet)))


def erasure_of(fleet: str) -> Erasure:
    return Erasure(session_id="X", fleet=fleet, requested_by="ops:cli:alice", requested_at=dt.datetime.now(dt.UTC))


@pytest.fixture
def recorder(tmp_path):
    config = producer_config(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), client_id="unit",
                             delivery_timeout_seconds=1)
    drainer = SpoolDrainer(tmp_path, config, max_bytes=100_000)
    drainer.start()
    recorder = SessionRecorder(TurnlogSettings(spool_dir=str(tmp_path), bootstrap_servers="127.0.0.1:1"))
    recorder._drainer = drainer  # X is held in the spool only (adopted, or ended while the broker was away)
    yield recorder
    drainer.close(1)


def test_another_fleets_erasure_of_the_id_leaves_the_spooled_events_and_later_writes_alone(recorder):
    drainer = recorder._drainer
    drainer.submit([spooled(0, "fleet-b")])
    assert drainer.fleets_held("X") == {"fleet-b"}
    recorder._on_erased([erasure_of("fleet-a")])
    assert drainer.holds("X")
    drainer.submit([spooled(1, "fleet-b")])  # still accepted
    assert drainer.pending("X") == 2


def test_the_erasure_of_the_fleet_the_events_claim_drops_them_and_refuses_more(recorder):
    drainer = recorder._drainer
    drainer.submit([spooled(0, "fleet-b")])
    recorder._on_erased([erasure_of("fleet-b")])
    wait_until(lambda: not drainer.holds("X"), timeout=10, what="the spool dropped X")
    with pytest.raises(SessionErasedError):
        drainer.submit([spooled(1, "fleet-b")])
