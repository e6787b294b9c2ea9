"""The store's jobs (``sinks/offsets.py``, ``transcript.py``, ``finalization.py``,
``claims.py``) and the order of work inside one batch's transaction.

On an SQLite file (no service needed); the contract tests in
``tests/integration/test_store_contract.py`` run the same operations on Postgres too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import event, select
from sqlalchemy.engine import Connection

from turnlog.sinks import SqlStore
from turnlog.sinks.batch import WriteResult
from turnlog.sinks.offsets import offsets_to_store
from turnlog.sinks.source_records import SourceMessage
from turnlog.sinks.tables import session_events, sessions, sink_offsets
from turnlog.sinks.transcript import TranscriptWriter

from tests.support import EventFactory, messages, sqlite_store

GROUP = "g"
TOPIC = "t.transcript"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    with sqlite_store(tmp_path / "store.db") as store:
        yield store


def test_offsets_only_move_forward_in_partition_order():
    rows = offsets_to_store(
        GROUP,
        {("b", 0): 5, ("a", 1): 3, ("a", 0): 7, ("a", 2): 1},
        {("a", 0): 7, ("a", 1): 1, ("a", 2): 4},
    )
    # ("a", 0) is where it was and ("a", 2) would move back: neither is written.
    assert [(r["topic"], r["partition"], r["next_offset"]) for r in rows] == [("a", 1, 3), ("b", 0, 5)]
    assert {r["consumer_group"] for r in rows} == {GROUP}


def _statement_kind(sql: str) -> str:
    """``"INSERT sessions"``, ``"UPDATE transcript_turns"``, ``"SELECT sink_offsets"``, ``"BEGIN"``, ..."""
    words = sql.split()
    if words[0] == "INSERT":
        return f"INSERT {words[2]}"
    if words[0] == "UPDATE":
        return f"UPDATE {words[1]}"
    if words[0] == "SELECT":
        found = re.search(r"\bFROM (\w+)", sql)
        return f"SELECT {found.group(1) if found else '?'}"
    return words[0]


def test_one_batch_writes_the_rows_then_finalizes_then_moves_the_offsets_in_one_transaction(store):
    f = EventFactory()
    batch = messages([f.started(), f.completed(1, 0, "hello"), f.partial(2, 1, "and"), f.ended(3, last_turn=1)])
    seen: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda c, cur, sql, *a: seen.append(_statement_kind(sql)))
    event.listen(store.engine, "commit", lambda conn: seen.append("COMMIT"))
    with store.engine.begin() as conn:
        result = store.apply_batch(conn, GROUP, batch)
    assert result.finalized == (f.session_id,)
    assert seen == [
        "BEGIN",  # SQLite's BEGIN IMMEDIATE
        "SELECT sink_offsets",  # 1. the group's offsets, locked; stale records dropped
        "SELECT sessions",  # 2. the batch's sessions, locked
        "INSERT sessions",  # a new session's id, claimed with a placeholder row
        "SELECT sessions",  # and locked
        "INSERT session_events",  # 3. the rows (pipelined on Postgres)
        "INSERT sessions",
        "INSERT transcript_turns",
        "UPDATE transcript_turns",  # the partial of an ended session: interrupted
        "UPDATE sessions",  # 4. the guarded finalize, after the rows
        "INSERT sink_offsets",  # 5. the offsets, last
        "COMMIT",  # one transaction for all of it
    ]
    with store.engine.connect() as conn:
        assert conn.execute(select(sessions.c.status, sessions.c.turn_count)).one() == ("finalized", 2)
        assert store.stored_offsets(conn, GROUP, [(TOPIC, 0)]) == {(TOPIC, 0): 4}


def test_every_statement_of_a_batch_is_compiled_once_and_then_taken_from_the_cache(store):
    """A statement SQLAlchemy cannot key (a custom element without its traversal, as
    ``SecondsBetween`` was) is compiled again at every execution: about a millisecond
    of the sink's CPU per finalized session."""
    first, second = EventFactory("s-first"), EventFactory("s-second")
    runs: list[tuple[str, object]] = []
    event.listen(store.engine, "before_cursor_execute",
                 lambda conn, cursor, sql, params, context, many: context.compiled is not None  # not raw SQL (BEGIN)
                 and runs.append((_statement_kind(sql), context.cache_hit)))
    for offset, f in ((0, first), (3, second)):
        with store.engine.begin() as conn:
            result = store.apply_batch(conn, GROUP, messages(
                [f.started(), f.completed(1, 0, "hello"), f.ended(2, last_turn=0)], first_offset=offset))
        assert result.finalized == (f.session_id,)
    dialect = store.engine.dialect
    assert [kind for kind, hit in runs if hit is dialect.NO_CACHE_KEY] == []
    finalizes = [hit for kind, hit in runs if kind == "UPDATE sessions"]
    assert finalizes == [dialect.CACHE_MISS, dialect.CACHE_HIT]


def test_a_writer_that_fails_leaves_neither_rows_nor_finalization_nor_offsets(store):
    f = EventFactory()
    batch = messages([f.started(), f.completed(1, 0, "hello"), f.ended(2, last_turn=0)])
    finalized: list[tuple[str, ...]] = []

    def write_then_fail(conn: Connection, fresh: Sequence[SourceMessage]) -> WriteResult:
        written = store.write_transcript(conn, fresh)
        finalized.append(written.finalized)
        raise RuntimeError("the writer failed after the rows and the finalize")

    with pytest.raises(RuntimeError), store.engine.begin() as conn:
        store.offsets.apply_tracked(conn, GROUP, batch, write_then_fail)
    assert finalized == [(f.session_id,)]  # it did finalize, in the transaction that rolled back
    with store.engine.connect() as conn:
        assert conn.execute(select(sessions.c.id)).all() == []
        assert conn.execute(select(session_events.c.seq)).all() == []
        assert conn.execute(select(sink_offsets.c.next_offset)).all() == []


class _RecordingFinalization:
    """A Finalization that records what it is asked, and what the transaction holds by then."""

    def __init__(self) -> None:
        self.asked: list[tuple[list[str], list[tuple[str, str]]]] = []

    def finalize_ready(self, conn: Connection, session_ids: Sequence[str]) -> tuple[str, ...]:
        rows = [tuple(r) for r in conn.execute(select(sessions.c.id, sessions.c.status).order_by(sessions.c.id))]
        self.asked.append((list(session_ids), rows))
        return tuple(session_ids)

    def finalize_session(self, conn, session_id, finalized_at):  # pragma: no cover - not used by the writer
        raise AssertionError("the writer finalizes through finalize_ready")

    def finalizable_sessions(self, conn, limit=100):  # pragma: no cover - not used by the writer
        raise AssertionError("the writer never sweeps")


def test_the_transcript_writer_hands_the_sessions_it_completed_to_finalization_after_its_rows(store):
    done, open_, later = EventFactory("s-done"), EventFactory("s-open"), EventFactory("s-later")
    finalization = _RecordingFinalization()
    writer = TranscriptWriter(store, finalization)
    batch = messages(
        [done.started(), done.ended(1), open_.started(), open_.partial(1, 0, "hm"), later.started(), later.ended(2)]
    )
    with store.engine.begin() as conn:
        result = writer.write(conn, batch)
    # s-later ended past a gap (seq 1 missing): not complete, so not a candidate.
    [(candidates, rows_then)] = finalization.asked
    assert candidates == ["s-done"]
    assert rows_then == [("s-done", "ended"), ("s-later", "ended"), ("s-open", "active")]
    assert result.finalized == ("s-done",)


def test_a_claim_hands_out_rising_epochs_for_an_active_session_and_none_for_an_ended_one(store):
    active, ended = EventFactory("s-active"), EventFactory("s-ended")
    with store.engine.begin() as conn:
        store.apply_batch(conn, None, messages([active.started(), ended.started(), ended.ended(1)]))
    with store.engine.begin() as conn:
        first, position = store.claims.claim_epoch(conn, "s-active")
        second, _ = store.claims.claim_epoch(conn, "s-active")
        ended_epoch, ended_position = store.claims.claim_epoch(conn, "s-ended")
        again, _ = store.claims.claim_epoch(conn, "s-ended")
        assert store.claims.claim_epoch(conn, "s-unknown") is None
        claimed = dict(conn.execute(select(sessions.c.id, sessions.c.claimed_epoch)).all())
    assert (first, second) == (1, 2)
    assert (position.status, position.last_seq, position.max_turn_index) == ("active", 0, None)
    assert (ended_epoch, again, ended_position.status) == (1, 1, "finalized")  # nothing claimed: the same answer
    assert claimed == {"s-active": 2, "s-ended": 0}
