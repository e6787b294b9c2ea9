"""What a turn was (``TurnCompleted.kind``, schema version 4): the model, its JSON Schema, the
recorder's ``kind=`` and what a resume gives back."""

import datetime as dt
import json

import msgspec
import pytest

from turnlog.producers import InvalidTurnError, StoredTurn
from turnlog.schemas import EventValidationError, TurnKind, decode_event, encode_event, turn_attributes

from tests.support import EventFactory
from tests.unit.test_recorder_validation import SECRET, session  # noqa: F401 - the fixture
from tests.unit.test_schemas import schema_errors


def typed_turn():
    return msgspec.structs.replace(EventFactory("s-1").completed(2, 0, "my order is 1234"), kind="typed",
                                   schema_version=msgspec.UNSET)


def test_a_turn_with_a_kind_is_version_4_stores_it_as_an_attribute_and_others_stay_where_they_were():
    turn = typed_turn()
    assert (turn.schema_version, turn.kind) == (4, "typed")
    assert turn_attributes(turn) == {"kind": "typed"}
    payload = encode_event(turn)
    assert json.loads(payload)["kind"] == "typed" and decode_event(payload) == turn
    assert schema_errors(payload, "turn.completed.v4.schema.json") == []
    assert schema_errors(payload, "event.v4.schema.json") == []
    assert schema_errors(payload, "turn.completed.v3.schema.json") != []  # a v3 reader refuses it (DLQ)
    spoken = EventFactory("s-1").completed(3, 1, "hello")
    assert (spoken.schema_version, spoken.kind, turn_attributes(spoken)) == (1, None, None)
    assert "kind" not in json.loads(encode_event(spoken))


@pytest.mark.parametrize(("change", "match"), [
    ({"schema_version": 3}, "kind needs schema_version 4"),
    ({"kind": "spoken"}, "kind"),  # absent means spoken: one way to say it on the wire
    ({"kind": "shouted"}, "kind"),
    ({"kind": 1}, "kind"),
])
def test_a_wrong_kind_or_version_is_refused(change, match):
    raw = {**json.loads(encode_event(typed_turn())), **change}
    with pytest.raises(EventValidationError, match=match):
        decode_event(json.dumps(raw))


async def test_the_recorder_writes_a_kind_other_than_spoken_and_names_a_wrong_one_by_its_type(session):  # noqa: F811
    await session.complete_turn(0, "user", "typed words", kind=TurnKind.TYPED)
    await session.complete_turn(1, "user", "summed up", kind="summary")
    await session.complete_turn(2, "user", "said", kind="spoken")
    await session.complete_turn(3, "user", "said too", kind=None)
    events = [decode_event(p) for p in session._recorder.sent]
    assert [(e.kind, e.schema_version) for e in events] == [("typed", 4), ("summary", 4), (None, 1), (None, 1)]
    for wrong in ("Typed", "", SECRET, 3, True):
        with pytest.raises(InvalidTurnError, match="kind must be one of") as refused:
            await session.complete_turn(4, "user", "x", kind=wrong)
        assert "4111" not in str(refused.value)
    assert len(session._recorder.sent) == 4 and session.open_turns == ()


def test_a_stored_turn_gives_its_kind_back_spoken_when_it_has_none():
    now = dt.datetime.now(dt.UTC)

    def stored(attributes):
        return StoredTurn(0, "user", "x", "complete", now, now, 0, 0, None, attributes=attributes)

    assert stored({"kind": "typed"}).kind is TurnKind.TYPED
    assert stored(None).kind is TurnKind.SPOKEN
    assert stored({"kind": "from a later release"}).kind is TurnKind.SPOKEN


def test_a_turn_out_of_the_llms_context_is_version_4_and_stores_it_beside_its_kind():
    turn = msgspec.structs.replace(EventFactory("s-1").completed(2, 1, "one moment please"), out_of_context=True,
                                   schema_version=msgspec.UNSET)
    assert (turn.schema_version, turn.out_of_context) == (4, True)
    assert turn_attributes(turn) == {"out_of_context": True}
    payload = encode_event(turn)
    assert json.loads(payload)["out_of_context"] is True and decode_event(payload) == turn
    assert schema_errors(payload, "turn.completed.v4.schema.json") == []
    assert schema_errors(payload, "turn.completed.v3.schema.json") != []
    both = msgspec.structs.replace(turn, kind="injected", schema_version=msgspec.UNSET)
    assert turn_attributes(both) == {"kind": "injected", "out_of_context": True}
    in_context = EventFactory("s-1").completed(3, 1, "hello")
    assert "out_of_context" not in json.loads(encode_event(in_context))  # the default is never written
    raw = {**json.loads(payload), "schema_version": 3}
    with pytest.raises(EventValidationError, match="out_of_context needs schema_version 4"):
        decode_event(json.dumps(raw))


async def test_the_recorder_writes_in_context_false_only_and_refuses_a_non_bool(session):  # noqa: F811
    await session.complete_turn(0, "assistant", "one moment please", in_context=False)
    await session.complete_turn(1, "assistant", "hello", in_context=True)
    events = [decode_event(p) for p in session._recorder.sent]
    assert [(e.out_of_context, e.schema_version) for e in events] == [(True, 4), (False, 1)]
    for wrong in (None, 0, "false", SECRET):
        with pytest.raises(InvalidTurnError, match="in_context must be a bool") as refused:
            await session.complete_turn(2, "assistant", "x", in_context=wrong)
        assert "4111" not in str(refused.value)
    assert len(session._recorder.sent) == 2 and session.open_turns == ()


def test_a_stored_turn_is_in_the_context_unless_it_says_otherwise():
    now = dt.datetime.now(dt.UTC)

    def stored(attributes):
        return StoredTurn(0, "assistant", "x", "complete", now, now, 0, 0, None, attributes=attributes)

    assert stored({"out_of_context": True}).in_context is False
    assert stored({"kind": "typed"}).in_context is True
    assert stored(None).in_context is True
