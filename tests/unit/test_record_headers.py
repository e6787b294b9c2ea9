"""The ``turnlog-type`` record header (``schemas/headers.py``): its values are the
event model's type tags, it round-trips, and a record without it is typed from
msgspec's real encoding, by name, whatever the order of the JSON members."""

from __future__ import annotations

import json

import pytest

from turnlog.schemas import EVENT_TYPE_HEADER, EVENT_TYPES, EventType, encode_event
from turnlog.schemas.headers import (
    event_type,
    header_event_type,
    peek_event_type,
    record_event_type,
    type_headers,
)

from tests.support import EventFactory

F = EventFactory("s-headers")
ONE_OF_EACH = {
    EventType.SESSION_STARTED: F.started(),
    EventType.TURN_PARTIAL: F.partial(1, 0, 'a "quoted" {"type":"turn.completed"} text'),
    EventType.TURN_COMPLETED: F.completed(2, 0, "done", barged_in=True),
    EventType.SESSION_ENDED: F.ended(3, last_turn=0),
}


def test_the_event_types_are_the_models_type_tags():
    assert {t.value for t in EventType} == {cls.__struct_config__.tag for cls in EVENT_TYPES}
    assert EVENT_TYPE_HEADER == "turnlog-type"


@pytest.mark.parametrize("kind", list(EventType))
def test_a_decoded_event_and_its_encoding_give_the_same_type(kind):
    event = ONE_OF_EACH[kind]
    assert event_type(event) is kind
    assert peek_event_type(encode_event(event)) is kind


@pytest.mark.parametrize("kind", list(EventType))
def test_the_type_is_read_by_name_not_by_position(kind):
    members = json.loads(encode_event(ONE_OF_EACH[kind]))
    tag = members.pop("type")
    type_last = json.dumps({**members, "type": tag}, separators=(", ", ": ")).encode()
    assert not type_last.startswith(b'{"type"')
    assert peek_event_type(type_last) is kind


@pytest.mark.parametrize(
    "value",
    [None, b"", b"{not json", b"[]", b'"turn.partial"', b'{"type": 3}', b'{"type": "turn.unknown"}', b'{"seq": 1}'],
)
def test_a_value_that_names_no_known_type_has_none(value):
    assert peek_event_type(value) is None


@pytest.mark.parametrize("kind", list(EventType))
def test_the_header_round_trips(kind):
    headers = type_headers(kind)
    assert headers == [("turnlog-type", kind.value.encode("ascii"))]
    assert header_event_type(headers) is kind


def test_the_header_is_read_in_each_of_confluent_kafkas_shapes():
    assert header_event_type({EVENT_TYPE_HEADER: b"turn.partial"}) is EventType.TURN_PARTIAL
    assert header_event_type([(EVENT_TYPE_HEADER, "session.ended")]) is EventType.SESSION_ENDED
    assert header_event_type({"other": b"turn.partial"}) is None
    assert header_event_type(None) is None


def test_without_a_type_there_is_no_header():
    assert type_headers(None) is None


def test_the_header_is_read_first_and_the_value_only_without_it():
    partial = encode_event(ONE_OF_EACH[EventType.TURN_PARTIAL])
    ended_header = [("other", b"x"), *type_headers(EventType.SESSION_ENDED)]
    # The header is the sequencer's word: the value is not decoded when it is there.
    assert record_event_type(ended_header, b"{not json") is EventType.SESSION_ENDED
    # Absent (an older record), or naming no known type: the value says.
    assert record_event_type(None, partial) is EventType.TURN_PARTIAL
    assert record_event_type([("other", b"x")], partial) is EventType.TURN_PARTIAL
    assert record_event_type([(EVENT_TYPE_HEADER, b"turn.unknown")], partial) is EventType.TURN_PARTIAL
    assert record_event_type([(EVENT_TYPE_HEADER, None)], partial) is EventType.TURN_PARTIAL
    assert header_event_type([(EVENT_TYPE_HEADER, b"\xff")]) is None
    # Neither says: None (the sink treats it as a record that closes the batch).
    assert record_event_type(None, b"{not json") is None


def test_the_sink_tells_a_partial_by_its_header_and_without_it_by_its_value():
    from turnlog.sinks.service import _is_partial

    partial = encode_event(ONE_OF_EACH[EventType.TURN_PARTIAL])
    completed = encode_event(ONE_OF_EACH[EventType.TURN_COMPLETED])
    assert _is_partial(type_headers(EventType.TURN_PARTIAL), completed) is True  # the header is read, not the value
    assert _is_partial(type_headers(EventType.TURN_COMPLETED), partial) is False
    assert _is_partial(None, partial) is True  # a record from before the header
    assert _is_partial(None, completed) is False
    assert _is_partial(None, b"{not json") is False  # undecodable: written at once, like any boundary
