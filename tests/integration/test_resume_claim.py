"""claim_resume, the store side of a resume, on SQLite and on the real Postgres
(parametrized ``store`` fixture): one transaction claims the epoch and reads the turns."""

from sqlalchemy import select

from turnlog.resume_barrier import claim_resume
from turnlog.sinks.tables import sessions

from tests.support import EventFactory, messages


def apply(store, events):
    with store.engine.begin() as conn:
        store.apply_batch(conn, None, messages(events))


def claim(store, session_id, fleets=None):
    with store.writing() as writes:
        return claim_resume(writes, session_id, fleets=fleets)


def claimed_epoch(store, session_id):
    with store.engine.connect() as conn:
        return conn.execute(select(sessions.c.claimed_epoch).where(sessions.c.id == session_id)).scalar_one()


def a_session_cut_off_mid_turn(f):
    return [
        f.started(),  # fleet "tests"
        f.completed(1, 0, "good morning", speaker="user", tokens=2),
        f.partial(2, 1, "how can"),
        f.completed(3, 1, "how can I help", speaker="agent", tokens=4, barged_in=True),
        f.partial(4, 2, "I wanted to", speaker="user"),
    ]


def test_a_claim_returns_a_new_epoch_and_the_stored_turns_in_order(store):
    f = EventFactory()
    apply(store, a_session_cut_off_mid_turn(f))
    first = claim(store, f.session_id)
    assert (first.epoch, first.status, first.last_seq, first.max_turn_index) == (1, "active", 4, 2)
    assert (first.next_seq, first.next_turn_index) == (5, 3)
    assert [(t.turn_index, t.speaker, t.text, t.status, t.input_tokens, t.output_tokens) for t in first.turns] == [
        (0, "user", "good morning", "complete", 2, 1),
        (1, "agent", "how can I help", "complete", 4, 1),
        (2, "user", "I wanted to", "partial", 0, 0),
    ]
    assert [t.barged_in for t in first.turns] == [False, True, False]
    assert first.turns[2].ended_at is None and first.turns[0].ended_at > first.turns[0].started_at
    assert claimed_epoch(store, f.session_id) == 1
    # A second claim (a retry, or a second resumer) gets a higher epoch, which fences the first.
    assert claim(store, f.session_id).epoch == 2
    assert claimed_epoch(store, f.session_id) == 2


def test_a_session_outside_the_fleets_is_missing_and_nothing_is_claimed(store):
    f = EventFactory()
    apply(store, a_session_cut_off_mid_turn(f))
    assert claim(store, f.session_id, fleets=frozenset({"someone-else"})) is None
    assert claim(store, "no-such-session", fleets=None) is None
    assert claimed_epoch(store, f.session_id) == 0
    assert claim(store, f.session_id, fleets=frozenset({"tests"})).epoch == 1


def test_an_ended_session_is_granted_nothing(store):
    f = EventFactory()
    apply(store, [*a_session_cut_off_mid_turn(f), f.ended(5, last_turn=2)])
    grant = claim(store, f.session_id)
    # The batch that ended it, complete, also finalized it (the sink finalizes in its transaction).
    assert grant.status == "finalized" and not grant.resumable
    assert claimed_epoch(store, f.session_id) == 0
