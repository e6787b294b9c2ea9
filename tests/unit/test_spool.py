"""The spool file and the drainer's local rules (no broker: the producer points at a closed port)."""

from __future__ import annotations

import pytest

from turnlog.producers.drainer import SpoolDrainer
from turnlog.producers.exceptions import SpoolFullError
from turnlog.producers.kafka import idempotent_config
from turnlog.producers.spool import SpooledEvent, SpoolFile


def event(session_id: str, seq: int, size: int = 10) -> SpooledEvent:
    return SpooledEvent("t.events", session_id.encode(), b"x" * size, session_id, seq)


def test_rows_come_back_in_append_order_and_deletes_remove_them(tmp_path):
    spool = SpoolFile(tmp_path)
    ids = spool.append([event("a", 0), event("b", 0), event("a", 1)])
    assert [r.event.seq for r in spool.rows_from(0, 10)] == [0, 0, 1]
    assert spool.totals() == (3, 30, {"a": 2, "b": 1})
    spool.append([event("a", 2)], delete_ids=ids[:2])  # one transaction: rows out, row in
    assert [(r.event.session_id, r.event.seq) for r in spool.rows_from(0, 10)] == [("a", 1), ("a", 2)]
    spool.close(remove_if_empty=True)
    assert spool.path.exists()  # it still holds rows: never removed


def test_a_live_spool_is_never_adopted_and_an_orphan_is_adopted_in_order(tmp_path):
    live = SpoolFile(tmp_path)
    live.append([event("live", 0)])
    dead = SpoolFile(tmp_path)
    dead.append([event("s", seq) for seq in range(5)])
    newcomer = SpoolFile(tmp_path)
    assert newcomer.adopt_orphans() == []  # both hold their locks

    dead.close(remove_if_empty=False)  # its lock is released, as the kernel does at SIGKILL
    adopted = newcomer.adopt_orphans()
    assert [(r.event.session_id, r.event.seq) for r in adopted] == [("s", seq) for seq in range(5)]
    assert [r.event.seq for r in newcomer.rows_from(0, 10)] == [0, 1, 2, 3, 4]
    assert not dead.path.exists() and live.path.exists()
    assert newcomer.adopt_orphans() == []
    live.close(remove_if_empty=True)
    newcomer.close(remove_if_empty=True)


def test_an_empty_spool_is_removed_at_close(tmp_path):
    spool = SpoolFile(tmp_path)
    spool.delete(spool.append([event("a", 0)]))
    spool.close(remove_if_empty=True)
    assert list(tmp_path.iterdir()) == []


def test_the_drainer_refuses_past_its_byte_limit_and_keeps_what_it_holds(tmp_path):
    config = idempotent_config("127.0.0.1:1", client_id="unit", delivery_timeout_seconds=1)
    drainer = SpoolDrainer(tmp_path, config, max_bytes=100)
    drainer.start()
    try:
        tickets = drainer.submit([event("a", 0, size=60)])
        tickets[0].spooled.result(timeout=10)
        with pytest.raises(SpoolFullError, match="TURNLOG_SPOOL_MAX_BYTES"):
            drainer.submit([event("a", 1, size=50)])
        assert drainer.pending("a") == 1 and drainer.pending() == 1
    finally:
        assert drainer.close(timeout=0) == 1  # no broker: it stays in the spool for the next recorder
    reopened = SpoolFile(tmp_path)
    assert [r.event.seq for r in reopened.adopt_orphans()] == [0]
    reopened.close(remove_if_empty=False)
