"""Postgres' pipelined writes (``PostgresStore.pipeline``): what a batch sends in one
round trip, and how an error returned at the pipeline's end comes out."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import pq
from sqlalchemy import event, insert, select, text

from turnlog.sinks import SqlStore, open_store
from turnlog.sinks.errors import store_errors
from turnlog.sinks.exceptions import RecordRejectedError, StoreUnavailableError
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.sinks.tables import sessions, sink_offsets

from tests.support import EventFactory, messages

GROUP = "pipeline-test"


@pytest.fixture
def pg_store(postgres_databases) -> Iterator[SqlStore]:
    store = open_store(postgres_databases.create())
    upgrade_to_head(store.engine)
    yield store
    store.engine.dispose()


def _offset_row(partition: int) -> dict[str, object]:
    return {"consumer_group": GROUP, "topic": "t", "partition": partition, "next_offset": 1}


def _terminate(store: SqlStore, backend: int) -> None:
    """Drop the server side of one of ``store``'s connections (as a Postgres restart
    would), from another connection, and wait until it is gone."""
    url = store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [backend])
        deadline = time.monotonic() + 10
        while other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [backend]).fetchone():
            assert time.monotonic() < deadline, f"backend {backend} still there after 10 s"
            time.sleep(0.05)


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
    # The locks are read, and the finalize's row count is read: none of them in the pipeline.
    assert [statement.split()[0] for statement, pipelined in seen if not pipelined] == [
        "SELECT", "SELECT", "UPDATE", "INSERT"]
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
