"""The spool file and the drainer's local rules (no broker: the producer points at a closed port)."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest

from turnlog.kafka import producer_config
from turnlog.producers.drainer import SpoolDrainer
from turnlog.producers.exceptions import SpoolError, SpoolFullError
from turnlog.producers.spool import SpooledEvent, SpoolFile, held_by_other_spools
from turnlog.settings import TurnlogSettings


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
    adopted: list = []
    assert newcomer.adopt_orphans(adopted.extend) == 0 and adopted == []  # both hold their locks

    dead.close(remove_if_empty=False)  # its lock is released, as the kernel does at SIGKILL
    assert newcomer.adopt_orphans(adopted.extend) == 5
    assert [(r.event.session_id, r.event.seq) for r in adopted] == [("s", seq) for seq in range(5)]
    assert [r.event.seq for r in newcomer.rows_from(0, 10)] == [0, 1, 2, 3, 4]
    assert [r.spooled_at for r in adopted] == [r.spooled_at for r in newcomer.rows_from(0, 10)]
    assert not dead.path.exists() and live.path.exists()
    assert newcomer.adopt_orphans(adopted.extend) == 0
    live.close(remove_if_empty=True)
    newcomer.close(remove_if_empty=True)


def test_what_other_spools_hold_of_a_session_is_counted_without_their_quarantine_or_our_own(tmp_path):
    mine = SpoolFile(tmp_path)
    mine.append([event("s", 0)])
    other = SpoolFile(tmp_path)
    [set_aside, *_] = other.append([event("s", 1), event("s", 2), event("s", 3), event("t", 0)])
    other.quarantine(set_aside)
    SpoolFile(tmp_path)  # a spool with nothing of the session
    (tmp_path / "spool-0-notadatabase.db").write_bytes(b"not sqlite")
    assert held_by_other_spools(tmp_path, "s", own=mine.path) == {other.path: 2}
    assert held_by_other_spools(tmp_path, "s", own=other.path) == {mine.path: 1}
    assert held_by_other_spools(tmp_path, "nobody", own=mine.path) == {}


def test_an_empty_spool_is_removed_at_close(tmp_path):
    spool = SpoolFile(tmp_path)
    spool.delete(spool.append([event("a", 0)]))
    spool.close(remove_if_empty=True)
    assert list(tmp_path.iterdir()) == []


def test_the_drainer_refuses_past_its_byte_limit_and_keeps_what_it_holds(tmp_path):
    config = producer_config(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), client_id="unit", delivery_timeout_seconds=1)
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
    adopted: list = []
    reopened.adopt_orphans(adopted.extend)
    assert [r.event.seq for r in adopted] == [0]
    reopened.close(remove_if_empty=False)


def test_an_unreadable_orphan_is_left_in_place_and_the_good_ones_are_adopted(tmp_path):
    good = SpoolFile(tmp_path)
    good.append([event("s", 0), event("s", 1)])
    good.close(remove_if_empty=False)
    broken = tmp_path / "spool-0-broken.db"
    broken.write_bytes(b"this is not a database" * 100)
    newcomer = SpoolFile(tmp_path)
    adopted: list = []
    assert newcomer.adopt_orphans(adopted.extend) == 2
    assert [r.event.seq for r in adopted] == [0, 1]
    assert broken.exists() and not good.path.exists()
    newcomer.close(remove_if_empty=False)


def test_a_quarantined_row_leaves_the_delivery_order_but_not_the_disk(tmp_path):
    spool = SpoolFile(tmp_path)
    ids = spool.append([event("a", 0), event("a", 1)])
    spool.quarantine(ids[0])
    assert [r.event.seq for r in spool.rows_from(0, 10)] == [1]
    spool.delete([ids[1]])
    spool.close(remove_if_empty=True)
    assert spool.path.exists()  # the quarantined row is kept for an operator
    newcomer = SpoolFile(tmp_path)
    newcomer.adopt_orphans(lambda rows: None)
    newcomer.close(remove_if_empty=True)
    assert newcomer.path.exists() and not spool.path.exists()  # carried over, still kept


def test_a_cancelled_waiter_does_not_stall_the_others(tmp_path):
    """A task cancelled while it waits for the fsync (asyncio passes the cancellation on
    to the ticket) must not keep the other events of the same group commit waiting."""
    import asyncio

    config = producer_config(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), client_id="unit", delivery_timeout_seconds=1)
    drainer = SpoolDrainer(tmp_path, config, max_bytes=10_000)
    drainer.start()

    async def main():
        first, second = drainer.submit([event("a", 0), event("b", 0)])
        waiter = asyncio.ensure_future(asyncio.wrap_future(first.spooled))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.wait_for(asyncio.wrap_future(second.spooled), 10)
        adopted = await asyncio.wait_for(asyncio.wrap_future(drainer.adopt_orphans()), 10)
        return first.spooled.cancelled(), adopted

    try:
        cancelled, adopted = asyncio.run(main())
        assert not cancelled and adopted == 0
    finally:
        assert drainer.close(timeout=0) == 2


def test_a_closed_drainer_refuses_new_events_and_a_restart(tmp_path):
    from turnlog.producers.exceptions import RecorderError

    config = producer_config(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), client_id="unit", delivery_timeout_seconds=1)
    drainer = SpoolDrainer(tmp_path, config, max_bytes=10_000)
    drainer.start()
    [ticket] = drainer.submit([event("a", 0)])
    assert drainer.close(timeout=0) == 1
    assert ticket.spooled.done() and ticket.spooled.exception() is None  # queued before the stop: spooled
    assert ticket.acked.exception() is not None  # never acknowledged: the waiter is told, not left hanging
    with pytest.raises(RecorderError, match="closed"):
        drainer.submit([event("a", 1)])
    with pytest.raises(RecorderError, match="closed"):
        drainer.start()


def test_a_failed_commit_is_retried_in_order_and_never_leaves_a_gap(tmp_path):
    from turnlog.producers.exceptions import SpoolError

    config = producer_config(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), client_id="unit", delivery_timeout_seconds=1)
    drainer = SpoolDrainer(tmp_path, config, max_bytes=10_000)
    drainer.start()
    real_append, failures = drainer._spool.append, []

    def full_disk_once(events, **kwargs):
        if not failures:
            failures.append(1)
            raise SpoolError("database or disk is full")
        return real_append(events, **kwargs)

    drainer._spool.append = full_disk_once
    try:
        tickets = drainer.submit([event("a", 0), event("a", 1)])
        for ticket in tickets:
            assert ticket.spooled.result(timeout=10) is None  # spooled after the retry, not failed
        assert failures == [1]
        assert [r.event.seq for r in drainer._spool.rows_from(0, 10)] == [0, 1]
    finally:
        drainer.close(timeout=0)


def test_an_unexpected_error_fails_the_adopt_waiters_and_delivery_starts_again(tmp_path, monkeypatch, caplog):
    from turnlog.producers import drainer as drainer_module
    from turnlog.producers.exceptions import SpoolError

    monkeypatch.setattr(drainer_module, "RETRY_FIRST_SECONDS", 0.1)
    config = producer_config(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), client_id="unit", delivery_timeout_seconds=1)
    drainer = SpoolDrainer(tmp_path, config, max_bytes=10_000)
    drainer.start()
    real_adopt, failures = drainer._adopt_now, []

    def broken_once(waiter):
        if not failures:
            failures.append(1)
            raise RuntimeError("the disk went away")
        real_adopt(waiter)

    drainer._adopt_now = broken_once
    try:
        with pytest.raises(SpoolError, match="adopting orphaned spools failed"):
            drainer.adopt_orphans().result(timeout=10)
        assert drainer.adopt_orphans().result(timeout=10) == 0  # the thread delivers again
        [ticket] = drainer.submit([event("a", 0)])
        assert ticket.spooled.result(timeout=10) is None
        assert failures == [1]
        assert "unexpected error; delivering again in 0.1 s" in caplog.text and "the disk went away" in caplog.text
    finally:
        assert drainer.close(timeout=0) == 1


def test_an_unexpected_error_at_the_stop_ends_the_thread(tmp_path, monkeypatch):
    import threading

    from turnlog.producers import drainer as drainer_module

    monkeypatch.setattr(drainer_module, "RETRY_FIRST_SECONDS", 0.05)
    config = producer_config(TurnlogSettings(bootstrap_servers="127.0.0.1:1"), client_id="unit", delivery_timeout_seconds=1)
    drainer = SpoolDrainer(tmp_path, config, max_bytes=10_000)
    drainer.start()
    calls = []

    def always_failing_write(appends):
        calls.append(len(appends))
        raise RuntimeError("the disk went away")

    drainer._write = always_failing_write
    closing = threading.Thread(target=drainer.close, kwargs={"timeout": 0}, daemon=True)
    closing.start()
    closing.join(10)
    assert not closing.is_alive()  # not retried once the stop was asked for
    assert len(calls) >= 1


@pytest.fixture(params=[0o022, 0o000], ids=["umask022", "umask000"])
def umask(request):
    """Run the test under this process umask (restored after)."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_the_folder_is_0700_and_every_spool_file_0600_whatever_the_umask(tmp_path, umask):
    folder = tmp_path / "new" / "spool"
    spool = SpoolFile(folder)
    spool.append([event("a", 0)])  # WAL mode: the -wal and -shm files exist while it is open
    try:
        files = {p.name.removeprefix(spool.path.stem): stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
        assert files == {".db": 0o600, ".db-wal": 0o600, ".db-shm": 0o600, ".lock": 0o600}
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    finally:
        spool.close(remove_if_empty=False)


def test_an_existing_loose_folder_of_ours_is_made_0700_and_its_orphans_0600(tmp_path, umask, caplog):
    folder = tmp_path / "spool"
    folder.mkdir()
    folder.chmod(0o755)
    dead = SpoolFile(folder)
    dead.append([event("s", 0)])
    dead.close(remove_if_empty=False)
    dead.path.chmod(0o644)  # as an older turnlog left it
    folder.chmod(0o777)

    newcomer = SpoolFile(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert "was mode 777" in caplog.text
    adopted: list = []
    assert newcomer.adopt_orphans(adopted.extend) == 1
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {0o600}
    newcomer.close(remove_if_empty=False)


def test_a_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(tmp_path).st_uid + 1)  # as if someone else owned it
    with pytest.raises(SpoolError, match="belongs to uid .* TURNLOG_SPOOL_DIR"):
        SpoolFile(tmp_path / "spool")


@pytest.mark.parametrize("name", ["with#hash", "with?query", "with%41percent", "with space", "ünïcødé", "a?mode=ro#x"])
def test_any_folder_name_opens_exactly_that_file(tmp_path, name):
    folder = tmp_path / name
    spool = SpoolFile(folder)
    spool.append([event("a", 0)])
    spool.close(remove_if_empty=False)
    assert spool.path.parent == folder and spool.path.stat().st_size > 0
    # Nothing was created beside it (a URI cut at '#' or '?' would have opened tmp_path/"with" or so).
    assert [p.name for p in tmp_path.iterdir()] == [name]
    with sqlite3.connect(spool.path) as db:  # the rows are in that very file
        assert db.execute("SELECT session_id, seq FROM spooled").fetchall() == [("a", 0)]


def test_two_folders_that_differ_after_a_hash_or_question_mark_do_not_share_a_database(tmp_path):
    first, second = SpoolFile(tmp_path / "spool#one"), SpoolFile(tmp_path / "spool#two")
    third = SpoolFile(tmp_path / "spool?a")
    first.append([event("one", 0)])
    second.append([event("two", 0), event("two", 1)])
    assert first.totals()[2] == {"one": 1} and second.totals()[2] == {"two": 2} and third.totals()[0] == 0
    for spool in (first, second, third):
        spool.close(remove_if_empty=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spool#one", "spool#two", "spool?a"]
