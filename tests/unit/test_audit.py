from turnlog.audit import fold_events
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
