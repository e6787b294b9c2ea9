"""`turnlog tail`'s lines (pure formatting)."""

import json

from turnlog.ops.tail import format_event
from turnlog.sinks.reads import StoredEvent


def test_turns_and_session_events_have_one_line_each():
    partial = StoredEvent(4, "turn.partial", json.dumps({"turn_index": 1, "speaker": "agent", "text": "so far"}))
    done = StoredEvent(5, "turn.completed", json.dumps({"turn_index": 1, "speaker": "agent", "text": "so far so good"}))
    ended = StoredEvent(6, "session.ended", json.dumps({"reason": "hangup"}))
    assert [format_event(e) for e in (partial, done, ended)] == [
        "[4] #1 agent: so far …",
        "[5] #1 agent: so far so good",
        "[6] -- session ended: hangup",
    ]


def test_control_characters_are_shown_escaped_never_sent_to_the_terminal():
    hostile = StoredEvent(3, "turn.completed", json.dumps({"turn_index": 0, "speaker": "ev\x1b[31mil", "text": "a\x1b[2J\x07 b\rFAKE\x9b"}))
    line = format_event(hostile)
    assert line == "[3] #0 ev\\x1b[31mil: a\\x1b[2J\\x07 b\\x0dFAKE\\x9b"
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in line)


def test_a_barged_in_turn_is_marked_cut_off_and_a_whole_one_is_not():
    from turnlog.schemas import encode_event

    from tests.support import EventFactory

    f = EventFactory("s")
    cut = StoredEvent(2, "turn.completed", encode_event(f.completed(2, 0, "Your order ships on", barged_in=True)).decode())
    whole = StoredEvent(3, "turn.completed", encode_event(f.completed(3, 1, "Which order?", speaker="B")).decode())
    partial = StoredEvent(4, "turn.partial", encode_event(f.partial(4, 2, "The one")).decode())
    assert [format_event(e) for e in (cut, whole, partial)] == [
        "[2] #0 A: Your order ships on [cut off]",
        "[3] #1 B: Which order?",
        "[4] #2 A: The one …",
    ]
