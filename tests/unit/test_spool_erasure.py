"""The spool and the drainer drop forgotten sessions (no broker: the producer points at a closed port)."""

from __future__ import annotations

import concurrent.futures

import pytest

from turnlog.kafka import producer_config
from turnlog.metrics import ERASED_RECORDS_SKIPPED
from turnlog.producers import SessionErasedError
from turnlog.producers.drainer import SpoolDrainer
from turnlog.producers.spool import SpooledEvent, SpoolFile
from turnlog.settings import TurnlogSettings

from tests.support import wait_until


def event(session_id: str, seq: int) -> SpooledEvent:
    return SpooledEvent("t.events", session_id.encode(), f"sealed-{session_id}-{seq}".encode(), session_id, seq)


def spool_bytes(folder) -> bytes:
    return b"".join(path.read_bytes() for path in folder.iterdir() if path.is_file())


def skipped() -> float:
    return ERASED_RECORDS_SKIPPED.labels(component="spool")._value.get()


def no_broker_drainer(folder, **kwargs) -> SpoolDrainer:
    config = producer_config(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), client_id="unit",
                             delivery_timeout_seconds=1)
    return SpoolDrainer(folder, config, max_bytes=100_000, **kwargs)


def test_dropping_sessions_deletes_their_rows_and_quarantine_and_leaves_no_byte_of_them_in_the_files(tmp_path):
    spool = SpoolFile(tmp_path)
    ids = spool.append([event("forgotten-1", 0), event("kept-1", 0), event("forgotten-1", 1), event("forgotten-2", 0)])
    spool.quarantine(ids[0])
    assert b"sealed-forgotten-1-1" in spool_bytes(tmp_path)  # in the -wal file before

    rows, quarantined = spool.drop_sessions({"forgotten-1", "forgotten-2", "unknown"})

    assert rows == [(ids[2], "forgotten-1", len(event("forgotten-1", 1).value)),
                    (ids[3], "forgotten-2", len(event("forgotten-2", 0).value))]
    assert quarantined == 1
    assert [(r.event.session_id, r.event.seq) for r in spool.rows_from(0, 10)] == [("kept-1", 0)]
    held = spool_bytes(tmp_path)  # the database, its -wal and -shm: zeroed and truncated
    assert b"forgotten-" not in held and b"sealed-kept-1-0" in held
    assert spool.drop_sessions(set()) == ([], 0)
    spool.close(remove_if_empty=False)


def test_the_drainer_drops_a_forgotten_sessions_events_fails_their_waiters_and_refuses_more(tmp_path):
    drainer = no_broker_drainer(tmp_path)
    drainer.start()
    before = skipped()
    try:
        forgotten = drainer.submit([event("gone", 0), event("gone", 1)])
        kept = drainer.submit([event("kept", 0)])
        for ticket in forgotten + kept:
            ticket.spooled.result(timeout=10)
        assert drainer.holds("gone") and drainer.pending() == 3

        drainer.forget({"gone"})
        with pytest.raises(SessionErasedError, match="session gone was forgotten"):
            drainer.submit([event("gone", 2)])
        for ticket in forgotten:
            with pytest.raises(SessionErasedError) as refused:
                ticket.acked.result(timeout=10)
            assert refused.value.session_id == "gone"
        wait_until(lambda: drainer.pending("gone") == 0, timeout=10, what="the forgotten events dropped")
        assert not drainer.holds("gone") and drainer.pending() == 1 and drainer.pending("kept") == 1
        assert skipped() - before == 2
        assert not kept[0].acked.done()  # still waiting for the broker
    finally:
        assert drainer.close(timeout=0) == 1
    assert b"sealed-gone" not in spool_bytes(tmp_path) and b"sealed-kept-0" in spool_bytes(tmp_path)


def test_adopted_rows_and_all_after_them_wait_for_the_erasure_check(tmp_path):
    dead = SpoolFile(tmp_path)
    dead.append([event("orphaned", 0), event("orphaned", 1)])
    dead.close(remove_if_empty=False)  # its lock released, as at SIGKILL
    checks: list[tuple[frozenset[str], concurrent.futures.Future[None]]] = []

    def erasure_check(session_ids):
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        checks.append((frozenset(session_ids), future))
        return future

    drainer = no_broker_drainer(tmp_path, erasure_check=erasure_check)
    produced: list[tuple[str, int]] = []

    def produce(row):  # stands in for the producer: records what would be sent, sends nothing
        produced.append((row.event.session_id, row.event.seq))
        drainer._in_flight[row.id] = (row.event.session_id, len(row.event.value))
        return True

    drainer._produce = produce
    drainer.start()
    try:
        assert [ids for ids, _ in checks] == [frozenset({"orphaned"})]
        [own] = drainer.submit([event("own", 0)])
        own.spooled.result(timeout=10)
        for _ in range(2):  # two rounds of the thread, each with a delivery pass after it
            drainer.adopt_orphans().result(timeout=10)
        assert produced == []  # the orphan's rows and our own behind them are held

        checks[0][1].set_result(None)  # the ledger was read for them: nothing forgotten
        wait_until(lambda: len(produced) == 3, timeout=10, what="the held rows produced")
        assert produced == [("orphaned", 0), ("orphaned", 1), ("own", 0)]
    finally:
        drainer.close(timeout=0)


def test_an_adopted_session_forgotten_before_its_check_resolves_is_never_produced(tmp_path):
    dead = SpoolFile(tmp_path)
    dead.append([event("orphaned", 0), event("other", 0)])
    dead.close(remove_if_empty=False)
    check: concurrent.futures.Future[None] = concurrent.futures.Future()
    drainer = no_broker_drainer(tmp_path, erasure_check=lambda ids: check)
    produced: list[tuple[str, int]] = []

    def produce(row):
        produced.append((row.event.session_id, row.event.seq))
        drainer._in_flight[row.id] = (row.event.session_id, len(row.event.value))
        return True

    drainer._produce = produce
    drainer.start()
    try:
        drainer.forget({"orphaned"})  # the ledger pass names it, then resolves
        check.set_result(None)
        wait_until(lambda: produced, timeout=10, what="the other session produced")
        drainer.adopt_orphans().result(timeout=10)
        assert produced == [("other", 0)]
    finally:
        drainer.close(timeout=0)
