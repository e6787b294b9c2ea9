import json
import uuid

import jsonschema
import pytest

from turnlog.schemas import EventValidationError, SessionEnded, decode_event, encode_event
from turnlog.schemas.generate import SCHEMA_DIR, render_schemas
from tests.support import EventFactory


def test_checked_in_json_schemas_match_the_model():
    rendered = render_schemas()
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in SCHEMA_DIR.glob("*.json")}
    assert on_disk == rendered, "run `python -m turnlog.schemas.generate` and commit schemas/json"


def test_every_event_type_round_trips_and_satisfies_its_json_schema():
    events = EventFactory("s-1")
    samples = [events.started(), events.partial(1, 0, "hel"), events.completed(2, 0, "hello"), events.ended(3, last_turn=0)]
    union = json.loads((SCHEMA_DIR / "event.v1.schema.json").read_text())
    for event in samples:
        payload = encode_event(event)
        assert decode_event(payload) == event
        jsonschema.validate(json.loads(payload), union)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"seq": -1}, "seq"),
        ({"type": "turn.exploded"}, "type"),
        ({"unexpected": 1}, "unexpected"),
        ({"emitted_at": "2026-01-01T00:00:00"}, "emitted_at"),
        ({"session_id": ""}, "session_id"),
        ({"schema_version": 2}, "schema_version"),
        ({"emitted_at": "9999-12-31T23:00:00-05:00"}, "emitted_at"),
        ({"session_id": "s-1\n"}, "session_id"),
        ({"reason": "a\u0000b"}, "reason"),
        ({"last_turn_index": 2**31}, "last_turn_index"),
    ],
)
def test_invalid_events_are_rejected_with_the_field_named(change, field):
    raw = json.loads(encode_event(EventFactory("s-1").ended(3)))
    raw.update(change)
    with pytest.raises(EventValidationError) as caught:
        decode_event(json.dumps(raw))
    assert field in caught.value.reason or "type" in caught.value.reason


def test_a_completed_turn_cannot_end_before_it_starts():
    raw = json.loads(encode_event(EventFactory("s-1").completed(2, 0, "x")))
    raw["ended_at"] = "2025-01-01T00:00:00Z"
    with pytest.raises(EventValidationError, match="ended_at"):
        decode_event(json.dumps(raw))


def test_not_json_is_a_validation_error():
    with pytest.raises(EventValidationError):
        decode_event(b"\xff\x00not json")


def test_session_ended_without_turns_is_valid():
    event = SessionEnded(
        event_id=uuid.uuid4(), session_id="s", seq=1, epoch=0, producer_id="p",
        emitted_at=EventFactory().ended(1).emitted_at, ended_at=EventFactory().ended(1).ended_at, reason="hangup",
    )
    assert decode_event(encode_event(event)).last_turn_index is None
