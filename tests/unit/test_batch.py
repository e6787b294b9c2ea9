import pytest

from turnlog.schemas import encode_event
from turnlog.sinks import SourceMessage
from turnlog.sinks.batch import (
    TURN_COMPLETE,
    TURN_INTERRUPTED,
    TURN_PARTIAL,
    SessionChanges,
    TurnRow,
    advance_contiguous,
    merge_session,
    plan_batch,
    ready_to_finalize,
    turn_update_wins,
)

from tests.support import EventFactory, messages


def row(status, epoch, seq):
    f = EventFactory("s")
    event = f.completed(seq, 0, "x", epoch=epoch) if status == TURN_COMPLETE else f.partial(seq, 0, "x", epoch=epoch)
    return TurnRow.from_event(event)


@pytest.mark.parametrize(
    ("current", "candidate", "wins"),
    [
        ((TURN_PARTIAL, 0, 3), (TURN_PARTIAL, 0, 4), True),
        ((TURN_PARTIAL, 0, 4), (TURN_PARTIAL, 0, 3), False),
        ((TURN_PARTIAL, 0, 4), (TURN_PARTIAL, 0, 4), False),
        ((TURN_PARTIAL, 0, 4), (TURN_COMPLETE, 0, 5), True),
        ((TURN_COMPLETE, 0, 5), (TURN_PARTIAL, 0, 6), False),
        ((TURN_COMPLETE, 0, 5), (TURN_COMPLETE, 0, 6), True),
        ((TURN_INTERRUPTED, 0, 5), (TURN_COMPLETE, 1, 6), True),
        ((TURN_PARTIAL, 1, 2), (TURN_PARTIAL, 0, 9), False),
        ((TURN_COMPLETE, 0, 9), (TURN_COMPLETE, 1, 9), True),
    ],
)
def test_turn_update_guard(current, candidate, wins):
    assert turn_update_wins(*current, row(*candidate)) is wins


def test_a_stale_update_in_the_same_batch_loses():
    f = EventFactory("s")
    plan = plan_batch(messages([f.started(), f.completed(5, 0, "final"), f.partial(4, 0, "fin")]))
    [turn] = plan.turns
    assert (turn.text, turn.status, turn.seq) == ("final", TURN_COMPLETE, 5)


def test_duplicates_in_a_batch_become_one_event_row_and_offsets_advance_past_all():
    f = EventFactory("s")
    event = f.completed(1, 0, "x")
    plan = plan_batch(messages([f.started(), event, event], first_offset=10))
    assert sorted(r["seq"] for r in plan.event_rows) == [0, 1]
    assert plan.next_offsets == {("t.transcript", 0): 13}


def test_undecodable_records_are_rejected_but_consumed():
    plan = plan_batch([SourceMessage("t", 1, 7, b"{not json")])
    assert len(plan.rejected) == 1 and plan.next_offsets == {("t", 1): 8}


def test_advance_contiguous_stops_at_a_gap():
    assert advance_contiguous(-1, {0, 1, 2, 4}) == 2
    assert advance_contiguous(5, {3, 4}) == 5


def test_merge_session_never_moves_status_backward():
    f = EventFactory("s")
    changes = SessionChanges("s", ended=f.ended(9), max_epoch=0, seqs={9})
    stored = {
        "fleet": "x", "agent_id": "y", "status": "finalized", "started_at": None, "ended_at": None,
        "end_reason": None, "epoch": 2, "last_seq": 9, "end_seq": 9, "metadata": None,
    }
    merged = merge_session(stored, changes, last_seq=3)
    assert merged["status"] == "finalized" and merged["epoch"] == 2 and merged["last_seq"] == 9
    fresh = merge_session(None, changes, last_seq=-1)
    assert fresh["status"] == "ended" and fresh["end_seq"] == 9


def stored_row(status, last_seq, end_seq):
    return {
        "fleet": "x", "agent_id": "y", "status": status, "started_at": None, "ended_at": None,
        "end_reason": None, "epoch": 0, "last_seq": last_seq, "end_seq": end_seq, "metadata": None,
    }


def test_a_batch_whose_session_ended_reaches_its_end_is_ready_to_finalize():
    f = EventFactory("s")
    ends = SessionChanges("s", ended=f.ended(9), seqs={8, 9})
    assert ready_to_finalize(merge_session(stored_row("active", 7, None), ends, last_seq=9))
    assert not ready_to_finalize(merge_session(stored_row("active", 5, None), ends, last_seq=5))  # seqs 6, 7 missing


def test_a_batch_that_closes_an_ended_sessions_last_gap_makes_it_ready_to_finalize():
    fills = SessionChanges("s", seqs={6})  # no session.ended in this batch: it came before the gap closed
    assert ready_to_finalize(merge_session(stored_row("ended", 5, 9), fills, last_seq=9))
    assert not ready_to_finalize(merge_session(stored_row("ended", 4, 9), fills, last_seq=4))


@pytest.mark.parametrize("status", ["finalized", "abandoned", "active"])
def test_only_an_ended_session_is_ready_to_finalize(status):
    changes = SessionChanges("s", seqs={9})
    assert not ready_to_finalize(merge_session(stored_row(status, 8, 9 if status != "active" else None), changes, last_seq=9))


def test_a_barged_in_turn_plans_as_complete_with_its_flag_and_a_partial_cannot_downgrade_it():
    f = EventFactory("s")
    cut = f.completed(2, 0, "Your order ships on Mon", barged_in=True)
    row_ = TurnRow.from_event(cut)
    assert (row_.status, row_.barged_in, row_.text) == (TURN_COMPLETE, True, "Your order ships on Mon")
    assert row_.as_row()["barged_in"] is True
    assert TurnRow.from_event(f.completed(3, 1, "whole")).barged_in is False
    assert TurnRow.from_event(f.partial(4, 2, "so far")).barged_in is False
    assert turn_update_wins(TURN_COMPLETE, 0, 2, TurnRow.from_event(f.partial(3, 0, "Your order"))) is False

    plan = plan_batch(messages([f.started(), f.partial(1, 0, "Your order ships"), cut, f.partial(3, 0, "Your order")]))
    [turn] = plan.turns
    assert (turn.status, turn.barged_in, turn.seq) == (TURN_COMPLETE, True, 2)
    assert [r["payload"] for r in plan.event_rows if r["seq"] == 2] == [encode_event(cut).decode()]


def test_an_old_v1_completed_turn_plans_as_not_barged_in():
    from tests.unit import events_v1 as v1

    f = EventFactory("s")
    new = f.completed(1, 0, "from an old writer")
    old = v1.TurnCompleted(**{n: getattr(new, n) for n in v1.TurnCompleted.__struct_fields__ if n != "schema_version"})
    plan = plan_batch([SourceMessage("t", 0, 0, v1.encode_event(old))])
    [turn] = plan.turns
    assert (turn.status, turn.barged_in, turn.text) == (TURN_COMPLETE, False, "from an old writer")
    assert plan.rejected == []
