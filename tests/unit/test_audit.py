from turnlog.ops.audit import fold_events
from turnlog.schemas import encode_event

from tests.support import EventFactory


def test_fold_marks_the_superseded_and_the_unfinished_partials_interrupted():
    f = EventFactory("s")
    events = [
        f.started(),
        f.completed(1, 0, "one", tokens=2),
        f.partial(2, 1, "cut by a"),  # its writer dies
        f.completed(3, 2, "cut by a crash", epoch=1, tokens=4),  # the resumed owner re-speaks it
        f.partial(4, 3, "left open", epoch=1),
        f.ended(5, epoch=1, seconds=90.25),
    ]
    folded = fold_events(encode_event(e) for e in reversed(events))
    assert [(t.turn_index, t.status) for t in folded.ordered_turns] == [
        (0, "complete"), (1, "interrupted"), (2, "complete"), (3, "interrupted"),
    ]
    assert (folded.turn_count, folded.interrupted_turn_count) == (4, 2)
    assert (folded.input_tokens, folded.output_tokens) == (6, 2)
    assert folded.duration_seconds == 90.25 and folded.end_seq == 5


def test_fold_keeps_a_barged_in_turn_complete_flagged_and_out_of_the_interrupted_count():
    f = EventFactory("s")
    events = [
        f.started(),
        f.partial(1, 0, "Let me ex"),
        f.completed(2, 0, "Let me explain the", barged_in=True, tokens=4),  # cut short by the other speaker
        f.completed(3, 1, "No, stop.", speaker="B", tokens=2),
        f.partial(4, 0, "Let me"),  # a stale partial after it changes nothing
        f.partial(5, 2, "I'll"),  # never completed: the session ends
        f.ended(6),
    ]
    folded = fold_events(encode_event(e) for e in events)
    assert [(t.turn_index, t.status, t.barged_in, t.text) for t in folded.ordered_turns] == [
        (0, "complete", True, "Let me explain the"),
        (1, "complete", False, "No, stop."),
        (2, "interrupted", False, "I'll"),
    ]
    assert (folded.turn_count, folded.interrupted_turn_count, folded.input_tokens) == (3, 1, 6)
