"""Postgres' pipelined writes (``PostgresStore.pipeline``): what a batch sends in one
round trip, how an error returned at the pipeline's end comes out, and two writers of
a new session (whose row does not exist yet, so a lock on it holds nothing)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import pq
from sqlalchemy import event, insert, select, text

from turnlog.sinks import SqlStore, open_store
from turnlog.sinks.driver_errors import store_errors
from turnlog.sinks.exceptions import RecordRejectedError, StoreUnavailableError
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.sinks.tables import sessions, sink_offsets

from tests.support import EventFactory, messages, wait_until

GROUP = "pipeline-test"


@pytest.fixture
def pg_store(postgres_databases) -> Iterator[SqlStore]:
    store = open_store(postgres_databases.create())
    upgrade_to_head(store.engine)
    yield store
    store.engine.dispose()


def _offset_row(partition: int) -> dict[str, object]:
    return {"consumer_group": GROUP, "topic": "t", "partition": partition, "next_offset": 1}


def _other_connection(store: SqlStore) -> psycopg.Connection:
    """A plain psycopg connection to ``store``'s database, outside its pool."""
    return psycopg.connect(store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False),
                           autocommit=True)


def _terminate(store: SqlStore, backend: int) -> None:
    """Drop the server side of one of ``store``'s connections (as a Postgres restart
    would), from another connection, and wait until it is gone."""
    with _other_connection(store) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [backend])
        wait_until(lambda: not other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [backend]).fetchone(),
                   timeout=10, what=f"backend {backend} gone", interval=0.05)


def test_a_batch_sends_its_writes_in_one_pipeline_and_reads_outside_it(pg_store):
    f = EventFactory()
    seen: list[tuple[str, bool]] = []

    def record(conn, cursor, sql, params, context, many):
        pipelined = conn.connection.driver_connection.pgconn.pipeline_status != pq.PipelineStatus.OFF
        seen.append((" ".join(sql.split()[:3]), pipelined))

    event.listen(pg_store.engine, "before_cursor_execute", record)
    with pg_store.engine.begin() as conn:
        result = pg_store.apply_batch(conn, GROUP, messages(
            [f.started(), f.completed(1, 0, "hello"), f.partial(2, 1, "and"), f.ended(3, last_turn=1)]))
    assert result.finalized == (f.session_id,)
    assert [statement for statement, pipelined in seen if pipelined] == [
        "INSERT INTO session_events",
        "INSERT INTO sessions",
        "INSERT INTO transcript_turns",
        "UPDATE transcript_turns SET",
    ]
    # The locks are read (a new session's after its placeholder row), and the finalize's
    # row count is read: none of them in the pipeline.
    assert [statement for statement, pipelined in seen if not pipelined] == [
        "SELECT sink_offsets.topic, sink_offsets.partition,", "SELECT sessions.id, sessions.fleet,",
        "INSERT INTO sessions", "SELECT sessions.id, sessions.fleet,", "UPDATE sessions SET",
        "INSERT INTO sink_offsets"]
    with pg_store.engine.connect() as conn:
        assert conn.execute(select(sessions.c.status, sessions.c.turn_count)).one() == ("finalized", 2)


def test_a_row_refused_at_the_pipelines_end_is_a_rejection_and_the_store_stays_usable(pg_store):
    with (pytest.raises(RecordRejectedError) as refused, store_errors(), pg_store.engine.begin() as conn,
          pg_store.pipeline(conn)):
        conn.execute(insert(sink_offsets).values(_offset_row(0)))
        conn.execute(insert(sink_offsets).values(_offset_row(0)))  # the same primary key again
    assert refused.value.sqlstate == "23505"  # unique_violation, from the server
    with pg_store.engine.begin() as conn, pg_store.pipeline(conn):
        conn.execute(insert(sink_offsets).values(_offset_row(1)))
    with pg_store.engine.connect() as conn:
        assert conn.execute(select(sink_offsets.c.partition)).scalars().all() == [1]  # the failed one rolled back


def test_the_first_refused_statement_is_the_error_even_with_statements_queued_behind_it(pg_store):
    with pg_store.engine.begin() as conn:
        conn.execute(insert(sink_offsets).values(_offset_row(0)))
    with (pytest.raises(RecordRejectedError) as refused, store_errors(), pg_store.engine.begin() as conn,
          pg_store.pipeline(conn)):
        conn.execute(insert(sink_offsets).values(_offset_row(0)))  # refused: committed before
        conn.execute(insert(sink_offsets), [_offset_row(1), _offset_row(2)])  # aborted behind it
    assert refused.value.sqlstate == "23505"  # the refusal, not the pipeline's abort (an OperationalError)


def _backend_waits_for_a_lock(store: SqlStore, backend: int) -> None:
    with _other_connection(store) as other:
        wait_until(lambda: other.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", [backend]).fetchone(),
            timeout=10, what=f"backend {backend} waiting for a lock", interval=0.02)


@pytest.mark.parametrize("second", ["the same records again", "the session's later records"])
def test_two_writers_of_a_new_session_take_turns_and_the_row_holds_both(pg_store, second):
    """The first writer's transaction is open when the second starts (``turnlog replay``
    beside the sink, or a zombie sink before its group has offsets). The second must
    wait, then merge into the committed row: merged into an empty one, its upsert
    would set ``last_seq`` back and drop the session's end."""
    f = EventFactory()
    events = [f.started(), f.completed(1, 0, "a"), f.completed(2, 1, "b"), f.ended(3, last_turn=1)]
    first, later = (events, events[:2]) if second == "the same records again" else (events[:2], events[2:])
    outcome: list[object] = []
    with pg_store.engine.connect() as conn_a:
        with conn_a.begin():
            pg_store.apply_batch(conn_a, None, messages(first))

            def second_writer() -> None:
                try:
                    with pg_store.engine.begin() as conn_b:
                        outcome.append(conn_b.execute(text("SELECT pg_backend_pid()")).scalar_one())
                        pg_store.apply_batch(conn_b, None, messages(later, first_offset=10))
                    outcome.append("committed")
                except Exception as e:  # reported below, not lost in the thread
                    outcome.append(e)

            writer = threading.Thread(target=second_writer)
            writer.start()
            wait_until(lambda: outcome, timeout=10, what="the second writer's backend pid", interval=0.01)
            _backend_waits_for_a_lock(pg_store, outcome[0])
        writer.join(10)
    assert outcome[1:] == ["committed"]
    with pg_store.engine.connect() as conn:
        row = conn.execute(select(sessions.c.status, sessions.c.last_seq, sessions.c.end_seq)).one()
    assert tuple(row) == ("finalized", 3, 3)


def test_a_connection_lost_before_the_pipelines_end_is_an_outage_and_the_next_transaction_reconnects(pg_store):
    with pytest.raises(StoreUnavailableError), store_errors(), pg_store.engine.begin() as conn:
        _terminate(pg_store, conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        with pg_store.pipeline(conn):
            conn.execute(insert(sink_offsets).values(_offset_row(0)))
    with pg_store.engine.begin() as conn, pg_store.pipeline(conn):
        conn.execute(insert(sink_offsets).values(_offset_row(0)))
    with pg_store.engine.connect() as conn:
        assert conn.execute(select(sink_offsets.c.partition)).scalars().all() == [0]


def test_without_pre_ping_a_connection_dropped_while_idle_fails_one_transaction_then_reconnects(postgres_databases):
    """What the sink relies on when it opens its store with ``pool_pre_ping=False``:
    the dropped connection costs one StoreUnavailableError (the sink applies the
    batch again), never a wrong classification or a pool that stays broken."""
    store = open_store(postgres_databases.create(), pool_pre_ping=False)
    upgrade_to_head(store.engine)
    try:
        with store.engine.connect() as conn:
            backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        _terminate(store, backend)
        with pytest.raises(StoreUnavailableError), store_errors(), store.engine.begin() as conn:
            conn.execute(insert(sink_offsets).values(_offset_row(0)))
        with store_errors(), store.engine.begin() as conn:
            conn.execute(insert(sink_offsets).values(_offset_row(0)))
        with store.engine.connect() as conn:
            assert conn.execute(select(sink_offsets.c.partition)).scalars().all() == [0]
    finally:
        store.engine.dispose()
