"""The store's contract, run on SQLite and on the real Postgres (parametrized ``store`` fixture)."""

import datetime as dt
import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, select, text

from turnlog.ops.audit import fold_events
from turnlog.schemas import encode_event
from turnlog.sinks.exceptions import SinkFencedError
from turnlog.sinks.tables import metadata, session_events, sessions, sink_offsets, transcript_turns

from tests.support import EventFactory, dump_store, messages, unfinalize

GROUP = "sink-test"
NOW = dt.datetime(2026, 2, 1, tzinfo=dt.UTC)


def apply(store, batch, group=GROUP):
    with store.engine.begin() as conn:
        return store.apply_batch(conn, group, batch)


def downgrade(store, revision: str) -> None:
    """Take ``store``'s schema down to the Alembic ``revision`` (``store.upgrade_schema()`` brings it back)."""
    from alembic import command
    from alembic.config import Config

    from turnlog.sinks.migrate import MIGRATIONS_DIR

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


def whole_session(f):
    return [
        f.started(),
        f.partial(1, 0, "good"),
        f.completed(2, 0, "good morning", tokens=2),
        f.partial(3, 1, "how can"),
        f.completed(4, 1, "how can I help", tokens=4),
        f.partial(5, 2, "I wanted to"),
        f.ended(6, last_turn=2, seconds=42.125),
    ]


def test_migrations_produce_exactly_the_declared_schema(store):
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []


def test_the_same_batch_applied_twice_leaves_an_identical_store(store):
    f = EventFactory()
    batch = messages(whole_session(f))
    first = apply(store, batch)
    once = dump_store(store, skip_columns=())  # finalized_at included: a redelivery finalizes nothing again
    second = apply(store, batch)
    assert (first.applied, second.applied, second.stale) == (7, 0, 7)
    assert (first.finalized, second.finalized) == ((f.session_id,), ())
    assert dump_store(store, skip_columns=()) == once


def test_the_same_events_at_new_offsets_change_nothing(store):
    f = EventFactory()
    apply(store, messages(whole_session(f)))
    once = dump_store(store, skip_columns=("next_offset",))
    result = apply(store, messages(whole_session(f), first_offset=100))  # re-emitted by a restarted sequencer
    assert (result.applied, result.finalized) == (7, ())
    assert dump_store(store, skip_columns=("next_offset",)) == once


def test_last_applied_at_moves_with_new_events_only(store):
    # The age retention counts for a session that never settles: the sink's clock at its last new event.
    f = EventFactory()
    events = whole_session(f)
    apply(store, messages(events[:3]))
    long_ago = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    with store.engine.begin() as conn:
        conn.execute(sessions.update().values(last_applied_at=long_ago))

    def last_applied_at():
        with store.engine.connect() as conn:
            return conn.execute(select(sessions.c.last_applied_at)).scalar_one()

    apply(store, messages(events[:3], first_offset=50))  # duplicates only
    assert last_applied_at() == long_ago
    apply(store, messages(events[3:4], first_offset=60))
    assert last_applied_at() > long_ago


def test_a_stale_lower_seq_update_in_the_same_batch_loses(store):
    f = EventFactory()
    apply(store, messages([f.started(), f.completed(2, 0, "the final text"), f.partial(1, 0, "the fin")]))
    with store.engine.connect() as conn:
        turn = conn.execute(select(transcript_turns)).mappings().one()
        logged = conn.execute(select(session_events.c.seq).order_by(session_events.c.seq)).scalars().all()
    assert (turn["text"], turn["status"], turn["seq"]) == ("the final text", "complete", 2)
    assert logged == [0, 1, 2]


def test_a_partial_never_downgrades_a_completed_turn_across_batches(store):
    f = EventFactory()
    apply(store, messages([f.started(), f.completed(1, 0, "done")]))
    apply(store, messages([f.partial(2, 0, "do")], first_offset=2))
    with store.engine.connect() as conn:
        turn = conn.execute(select(transcript_turns)).mappings().one()
    assert (turn["status"], turn["text"]) == ("complete", "done")


def assert_aggregates_equal_the_log(store, session_id, *, turns, interrupted, tokens, seconds):
    with store.engine.connect() as conn:
        row = conn.execute(select(sessions).where(sessions.c.id == session_id)).mappings().one()
        payloads = conn.execute(select(session_events.c.payload).where(session_events.c.session_id == session_id)).scalars().all()
    folded = fold_events(payloads)
    assert row["status"] == "finalized" and row["finalized_at"] is not None
    assert (row["turn_count"], row["interrupted_turn_count"]) == (folded.turn_count, folded.interrupted_turn_count) == (turns, interrupted)
    assert (row["input_tokens"], row["output_tokens"]) == (folded.input_tokens, folded.output_tokens) == tokens
    assert row["duration_seconds"] == folded.duration_seconds == seconds
    return row


def test_the_batch_that_ends_a_session_finalizes_it_in_its_transaction(store):
    f = EventFactory()
    result = apply(store, messages(whole_session(f)))
    assert result.finalized == (f.session_id,)
    # Committed with the rows and the offsets: never ended-and-complete without its aggregates.
    assert_aggregates_equal_the_log(store, f.session_id, turns=3, interrupted=1, tokens=(6, 2), seconds=42.125)
    with store.engine.begin() as conn:
        assert store.finalizable_sessions(conn) == []
        assert store.finalize_session(conn, f.session_id, NOW) is False  # finalize once


def test_a_rolled_back_batch_finalizes_nothing_and_its_redelivery_finalizes_once(store):
    f = EventFactory()
    batch = messages(whole_session(f))
    with store.engine.connect() as conn:  # a sink killed before its commit
        transaction = conn.begin()
        assert store.apply_batch(conn, GROUP, batch).finalized == (f.session_id,)
        transaction.rollback()
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(sessions)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(sink_offsets)).scalar_one() == 0
    assert apply(store, batch).finalized == (f.session_id,)
    assert_aggregates_equal_the_log(store, f.session_id, turns=3, interrupted=1, tokens=(6, 2), seconds=42.125)


def test_finalize_twice_gives_one_result_equal_to_a_recomputation_from_the_log(store):
    f = EventFactory()
    apply(store, messages(whole_session(f)))
    unfinalize(store, f.session_id)  # as a sink that did not finalize in its batch left it
    with store.engine.begin() as conn:
        first = store.finalize_session(conn, f.session_id, NOW)
    with store.engine.begin() as conn:
        second = store.finalize_session(conn, f.session_id, NOW + dt.timedelta(hours=1))
    assert (first, second) == (True, False)
    row = assert_aggregates_equal_the_log(store, f.session_id, turns=3, interrupted=1, tokens=(6, 2), seconds=42.125)
    assert row["finalized_at"] == NOW


def test_racing_finalizers_finalize_once(store):
    f = EventFactory()
    apply(store, messages(whole_session(f)))
    unfinalize(store, f.session_id)
    results, barrier = [], threading.Barrier(4)

    def finalize():
        barrier.wait()
        with store.engine.begin() as conn:
            results.append(store.finalize_session(conn, f.session_id, NOW))

    threads = [threading.Thread(target=finalize) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]


def test_the_sweep_finalizes_a_session_stored_without_finalization_once(store):
    from turnlog.sinks.sweep import sweep_once

    f, g = EventFactory(), EventFactory()
    apply(store, messages(whole_session(f)))
    apply(store, messages(whole_session(g)[:4], first_offset=7))  # g is still active
    unfinalize(store, f.session_id)
    assert sweep_once(store, page=1) == [f.session_id]
    assert sweep_once(store) == []
    assert_aggregates_equal_the_log(store, f.session_id, turns=3, interrupted=1, tokens=(6, 2), seconds=42.125)


def test_an_incomplete_session_is_not_finalized_until_the_batch_that_completes_it(store):
    f = EventFactory()
    events = whole_session(f)
    assert apply(store, messages(events[:3] + events[4:])).finalized == ()  # seq 3 never arrived
    with store.engine.begin() as conn:
        assert store.finalize_session(conn, f.session_id, NOW) is False
        assert store.finalizable_sessions(conn) == []
        row = conn.execute(select(sessions.c.status, sessions.c.last_seq)).one()
    assert tuple(row) == ("ended", 2)
    # The gap fills later, in a batch without the session.ended: that batch finalizes it.
    assert apply(store, messages([events[3]], first_offset=50)).finalized == (f.session_id,)
    with store.engine.begin() as conn:
        assert store.finalize_session(conn, f.session_id, NOW) is False


def test_a_batch_that_closes_a_gap_counts_its_own_seqs_past_the_gap(store):
    """Seq 5 was stored past a gap; the batch that fills 3 and 4 also brings 6, so the
    log (with this batch's events in it) says 6 is the highest contiguous seq."""
    f = EventFactory()
    apply(store, messages([f.started(), f.completed(1, 0, "a"), f.completed(2, 1, "b"), f.completed(5, 4, "e")]))
    apply(store, messages([f.completed(3, 2, "c"), f.completed(4, 3, "d"), f.completed(6, 5, "f")], first_offset=4))
    with store.engine.connect() as conn:
        row = conn.execute(select(sessions.c.last_seq, sessions.c.max_seq)).one()
    assert tuple(row) == (6, 6)


def test_sink_offsets_never_move_backward(store):
    f = EventFactory()
    apply(store, messages([f.started(), f.completed(1, 0, "a")], first_offset=10))
    result = apply(store, messages([f.started()], first_offset=3))  # a paused (zombie) sink's old batch
    with store.engine.connect() as conn:
        offset = conn.execute(select(sink_offsets.c.next_offset)).scalar_one()
    assert result.stale == 1 and offset == 12


def test_a_sink_whose_partition_another_sink_claimed_since_writes_no_row_and_no_offset(store):
    f = EventFactory()
    partition = [("t.transcript", 0)]
    with store.engine.begin() as conn:
        zombie = store.claim_partitions(conn, GROUP, partition)

    def apply_as(conn, fences, batch):
        return store.offsets.apply_tracked(conn, GROUP, batch, store.write_transcript, fences=fences)

    with store.engine.begin() as conn:
        assert apply_as(conn, zombie, messages([f.started()])).applied == 1
    with store.engine.begin() as conn:
        owner = store.claim_partitions(conn, GROUP, partition)  # the group moved the partition
    assert owner[partition[0]] == zombie[partition[0]] + 1
    before = dump_store(store, skip_columns=())
    with pytest.raises(SinkFencedError) as fenced, store.engine.begin() as conn:
        apply_as(conn, zombie, messages([f.completed(1, 0, "after waking up")], first_offset=1))
    assert fenced.value.fenced == {partition[0]: (zombie[partition[0]], owner[partition[0]])}
    with pytest.raises(SinkFencedError), store.engine.begin() as conn:
        store.skip_records(conn, GROUP, messages([f.completed(1, 0, "x")], first_offset=1), fences=zombie)
    with pytest.raises(SinkFencedError), store.engine.begin() as conn:
        apply_as(conn, {}, messages([f.completed(1, 0, "never claimed")], first_offset=1))
    assert dump_store(store, skip_columns=()) == before
    with store.engine.begin() as conn:
        assert apply_as(conn, owner, messages([f.completed(1, 0, "the owner's")], first_offset=1)).applied == 1


def test_a_new_epoch_marks_the_old_writers_partial_interrupted_and_keeps_its_completed_turns(store):
    f = EventFactory()
    apply(store, messages([f.started(), f.completed(1, 0, "kept"), f.partial(2, 1, "half a sen")]))
    apply(store, messages([f.completed(3, 2, "half a sentence", epoch=1)], first_offset=3))
    with store.engine.connect() as conn:
        turns = conn.execute(select(transcript_turns.c.turn_index, transcript_turns.c.status, transcript_turns.c.text).order_by("turn_index")).all()
        epoch = conn.execute(select(sessions.c.epoch)).scalar_one()
    assert [tuple(t) for t in turns] == [(0, "complete", "kept"), (1, "interrupted", "half a sen"), (2, "complete", "half a sentence")]
    assert epoch == 1


def test_events_round_trip_byte_for_byte_into_the_log(store):
    f = EventFactory()
    events = whole_session(f)
    apply(store, messages(events))
    with store.engine.connect() as conn:
        payloads = conn.execute(select(session_events.c.payload).order_by(session_events.c.seq)).scalars().all()
    assert payloads == [encode_event(e).decode() for e in events]


def stored_turn_flags(store, session_id):
    with store.engine.connect() as conn:
        t = transcript_turns.c
        query = select(t.turn_index, t.status, t.barged_in, t.text).where(t.session_id == session_id).order_by(t.turn_index)
        return [tuple(r) for r in conn.execute(query)]


def test_a_barged_in_turn_is_complete_with_its_spoken_words_and_flagged_apart_from_interrupted(store):
    f = EventFactory()
    events = [
        f.started(),
        f.partial(1, 0, "Your order ships on"),
        f.completed(2, 0, "Your order ships on Mon", barged_in=True, tokens=5),  # the user cut in
        f.completed(3, 1, "Wait, which order?", speaker="B", tokens=2),
        f.partial(4, 0, "Your order"),  # a late partial never downgrades the barged-in turn
        f.partial(5, 2, "The one from"),  # left unfinished when the session ends
        f.ended(6, last_turn=2, seconds=30),
    ]
    apply(store, messages(events[:4]))
    assert apply(store, messages(events[4:], first_offset=4)).finalized == (f.session_id,)
    assert stored_turn_flags(store, f.session_id) == [
        (0, "complete", True, "Your order ships on Mon"),
        (1, "complete", False, "Wait, which order?"),
        (2, "interrupted", False, "The one from"),
    ]
    with store.engine.connect() as conn:  # the second batch ended the session and finalized it
        row = conn.execute(select(sessions).where(sessions.c.id == f.session_id)).mappings().one()
        payloads = conn.execute(select(session_events.c.payload).where(session_events.c.session_id == f.session_id)).scalars().all()
    folded = fold_events(payloads)
    # A barged-in turn counts as a completed turn, never as an interrupted one, in SQL and in the fold alike.
    assert (row["turn_count"], row["interrupted_turn_count"]) == (folded.turn_count, folded.interrupted_turn_count) == (3, 1)
    assert (row["input_tokens"], row["output_tokens"]) == (folded.input_tokens, folded.output_tokens) == (7, 2)
    assert [(t.turn_index, t.status, t.barged_in) for t in folded.ordered_turns] == [
        (turn, status, barged) for turn, status, barged, _ in stored_turn_flags(store, f.session_id)
    ]


def test_a_newer_completion_of_a_turn_replaces_its_barged_in_flag(store):
    f = EventFactory()
    apply(store, messages([f.started(), f.completed(1, 0, "I was say", barged_in=True)]))
    apply(store, messages([f.completed(2, 0, "I was saying, the invoice", epoch=1)], first_offset=2))
    assert stored_turn_flags(store, f.session_id) == [(0, "complete", False, "I was saying, the invoice")]
    apply(store, messages([f.completed(3, 0, "I was saying, the inv", epoch=1, barged_in=True)], first_offset=3))
    assert stored_turn_flags(store, f.session_id) == [(0, "complete", True, "I was saying, the inv")]


def test_verify_digests_tell_a_barged_in_turn_from_a_whole_one(store):
    from sqlalchemy import update

    from turnlog.ops.verify import compare_digests, session_digests

    f = EventFactory()
    apply(store, messages([f.started(), f.completed(1, 0, "Hold on", barged_in=True), f.completed(2, 1, "Sure")]))
    before = session_digests(store, [f.session_id])
    assert [t["barged_in"] for t in before[f.session_id].turns] == [True, False]
    with store.engine.begin() as conn:
        conn.execute(update(transcript_turns).where(transcript_turns.c.session_id == f.session_id).values(barged_in=False))
    after = session_digests(store, [f.session_id])
    [difference] = compare_digests(before, after)
    assert difference.what == "turn 0: barged_in differ"


def test_migration_0005_reads_earlier_turns_as_not_barged_in_and_downgrades(store):
    from sqlalchemy import inspect

    from turnlog.sinks.migrate import upgrade_to_head

    downgrade(store, "0004")
    assert "barged_in" not in {c["name"] for c in inspect(store.engine).get_columns("transcript_turns")}
    f = EventFactory()
    with store.engine.begin() as conn:  # a turn as a sink before 0005 wrote it
        conn.execute(
            text(
                "INSERT INTO transcript_turns (session_id, turn_index, speaker, text, status, started_at, input_tokens,"
                " output_tokens, epoch, seq) VALUES (:sid, 0, 'A', 'old', 'complete', :at, 0, 0, 0, 1)"
            ),
            {"sid": f.session_id, "at": NOW},
        )
    upgrade_to_head(store.engine)
    assert stored_turn_flags(store, f.session_id) == [(0, "complete", False, "old")]


def test_a_turns_stored_attributes_reach_the_readers_the_resume_and_the_audit_fold(store, monkeypatch):
    """The event model's ``stored_attributes`` are kept in ``transcript_turns.attributes`` with no
    column of their own; a turn that uses none stores NULL. ``barged_in`` stands in here for a
    future optional field."""
    from turnlog.resume_barrier import claim_resume
    from turnlog.schemas import TurnCompleted

    monkeypatch.setattr(TurnCompleted, "stored_attributes", ("barged_in",))
    f = EventFactory()
    events = [f.started(), f.completed(1, 0, "hello", barged_in=True), f.completed(2, 1, "hi", speaker="agent")]
    apply(store, messages(events))
    with store.reading() as reads:
        assert [t["attributes"] for t in reads.turns(f.session_id)] == [{"barged_in": True}, None]
        page = reads.turn_page(f.session_id, limit=10)
    assert [t["attributes"] for t in page.turns] == [{"barged_in": True}, None]
    with store.writing() as writes:
        grant = claim_resume(writes, f.session_id)
    assert [t.attributes for t in grant.turns] == [{"barged_in": True}, None]
    folded = fold_events(encode_event(e) for e in events)
    assert [t.attributes for t in folded.ordered_turns] == [{"barged_in": True}, None]


def test_migration_0009_adds_turn_attributes_as_null_and_downgrades(store):
    from sqlalchemy import inspect

    f = EventFactory()
    apply(store, messages([f.started(), f.completed(1, 0, "kept")]))
    downgrade(store, "0008")
    assert "attributes" not in {c["name"] for c in inspect(store.engine).get_columns("transcript_turns")}
    store.upgrade_schema()
    with store.reading() as reads:
        assert [(t["text"], t["attributes"]) for t in reads.turns(f.session_id)] == [("kept", None)]


def test_migration_0011_keeps_bare_ids_and_takes_the_longest_session_key(store):
    from turnlog.schemas.session_keys import MAX_AGENT_SESSION_ID, MAX_FLEET_IN_KEY, session_key

    downgrade(store, "0010")
    bare = EventFactory()  # a session as the release before keys wrote it: its bare id
    apply(store, messages([bare.started(), bare.completed(1, 0, "kept")]))
    store.upgrade_schema()
    longest = EventFactory(session_key("f" * MAX_FLEET_IN_KEY, "s" * MAX_AGENT_SESSION_ID))
    apply(store, messages([longest.started(), longest.completed(1, 0, "stored")], first_offset=2))
    with store.reading() as reads:
        assert [t["text"] for t in reads.turns(bare.session_id)] == ["kept"]
        assert [t["text"] for t in reads.turns(longest.session_id)] == ["stored"]
