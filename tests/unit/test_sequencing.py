from turnlog.schemas import encode_event
from turnlog.stream_processors.sequencing import SessionSequence, raw_of, sequence

from tests.support import EventFactory

MAX = 4


def feed(state, events, first_offset=0):
    """Apply events in the given order, at consecutive offsets; returns (emitted seqs, dlq reasons, decisions)."""
    emitted, dlq, decisions = [], [], []
    for i, event in enumerate(events):
        decision = sequence(state, event, encode_event(event), first_offset + i, max_buffer=MAX)
        emitted += [raw_of(item) for item in decision.emit]
        dlq += [reason for _, reason in decision.dlq]
        decisions.append(decision)
    return [_seq(raw) for raw in emitted], dlq, decisions


def _seq(raw):
    from turnlog.schemas import decode_event

    return decode_event(raw).seq


def test_in_order_events_pass_through():
    f = EventFactory()
    state = SessionSequence()
    emitted, dlq, _ = feed(state, [f.started(), f.partial(1, 0, "a"), f.completed(2, 0, "a b")])
    assert emitted == [0, 1, 2] and dlq == [] and state.next_seq == 3


def test_a_resent_event_is_dropped_as_duplicate():
    f = EventFactory()
    started, turn = f.started(), f.completed(1, 0, "x")
    state = SessionSequence()
    emitted, _, decisions = feed(state, [started, turn, turn])
    assert emitted == [0, 1]
    assert decisions[-1].duplicate


def test_out_of_order_events_are_buffered_and_released_in_seq_order():
    f = EventFactory()
    state = SessionSequence()
    emitted, dlq, decisions = feed(state, [f.started(), f.completed(3, 2, "c"), f.completed(2, 1, "b"), f.completed(1, 0, "a")])
    assert emitted == [0, 1, 2, 3] and dlq == []
    assert decisions[1].gap_opened and not state.buffer


def test_a_stale_epoch_is_fenced_to_the_dlq():
    f = EventFactory()
    state = SessionSequence()
    emitted, dlq, _ = feed(state, [f.started(), f.completed(1, 0, "old", epoch=0), f.completed(2, 1, "new", epoch=1), f.completed(3, 2, "zombie", epoch=0)])
    assert emitted == [0, 1, 2]
    assert len(dlq) == 1 and dlq[0].startswith("fenced: epoch 0")


def test_a_new_epoch_fences_the_old_epochs_buffered_events():
    f = EventFactory()
    state = SessionSequence()
    emitted, dlq, _ = feed(state, [f.started(), f.completed(5, 4, "old gap", epoch=0), f.completed(1, 0, "new", epoch=1)])
    assert emitted == [0, 1]
    assert dlq and "superseded by epoch 1" in dlq[0] and not state.buffer


def test_a_new_owner_wins_seqs_a_zombie_took_after_the_barrier():
    f = EventFactory()
    state = SessionSequence()
    emitted, dlq, _ = feed(state, [f.started(), f.completed(1, 0, "zombie", epoch=0), f.completed(1, 0, "owner", epoch=1)])
    assert emitted == [0, 1, 1] and dlq == []
    assert state.epoch == 1 and state.next_seq == 2


def test_a_full_reorder_buffer_rejects_to_the_dlq():
    f = EventFactory()
    state = SessionSequence()
    late = [f.completed(seq, seq - 1, "x") for seq in range(2, 2 + MAX + 1)]
    emitted, dlq, _ = feed(state, [f.started(), *late])
    assert emitted == [0]
    assert len(dlq) == 1 and dlq[0].startswith("overflow: reorder buffer full (4 events)")


def test_events_after_the_end_go_to_the_dlq():
    f = EventFactory()
    state = SessionSequence()
    emitted, dlq, _ = feed(state, [f.started(), f.ended(1), f.completed(2, 0, "late")])
    assert emitted == [0, 1]
    assert dlq == ["after session.ended: seq 2 arrived after the session ended"]


def test_reprocessing_from_an_older_state_re_emits_the_same_events_in_the_same_order():
    f = EventFactory()
    events = [f.started(), f.completed(3, 2, "c"), f.completed(2, 1, "b"), f.completed(1, 0, "a"), f.ended(4)]
    before = SessionSequence()
    feed(before, events[:1])
    saved = SessionSequence.from_json(before.to_json())  # the state the changelog holds at the crash
    first, _, _ = feed(before, events[1:])
    again, _, decisions = feed(saved, events[1:])  # redelivered from the committed offset
    assert first == again == [1, 2, 3, 4]
    # and against the newer state, the same records are duplicates
    emitted, dlq, decisions = feed(before, events[1:])
    assert emitted == [] and dlq == [] and all(d.duplicate for d in decisions)


def test_state_survives_its_json_form():
    f = EventFactory()
    state = SessionSequence()
    feed(state, [f.started(), f.completed(3, 2, "c"), f.completed(1, 0, "a", epoch=1)])
    assert SessionSequence.from_json(state.to_json()) == state


def test_a_reused_session_id_goes_to_the_dlq_not_silently_away():
    old, new = EventFactory("same-id"), EventFactory("same-id")
    state = SessionSequence()
    feed(state, [old.started(), old.ended(1)])
    emitted, dlq, _ = feed(state, [new.started(), new.completed(1, 0, "x"), new.ended(2)])
    assert emitted == []
    assert len(dlq) == 3 and all("session id reused" in r for r in dlq)


def test_a_gap_names_the_offsets_where_the_missing_seq_must_be():
    f = EventFactory()
    state = SessionSequence()
    feed(state, [f.started(), f.completed(1, 0, "a")], first_offset=100)  # offsets 100, 101
    assert state.missing_range() is None
    feed(state, [f.completed(3, 2, "c"), f.completed(4, 3, "d")], first_offset=110)  # seq 2 never came
    assert state.missing_range() == (102, 109)
    emitted, _, _ = feed(state, [f.completed(2, 1, "b")], first_offset=105)  # re-read from the log
    assert emitted == [2, 3, 4] and state.missing_range() is None and state.applied_offset == 111
