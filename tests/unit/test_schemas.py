import hashlib
import json
import uuid

import jsonschema
import msgspec
import pytest

from turnlog.schemas import (
    SCHEMA_VERSION,
    SCHEMA_VERSIONS,
    EventValidationError,
    SessionEnded,
    ToolCall,
    decode_event,
    encode_event,
)
from turnlog.schemas.generate import FROZEN_FILE, SCHEMA_DIR, frozen_hashes, render_schemas

from tests.support import EventFactory
from tests.unit import events_v1 as v1

#: The released version-1 files, as v1 readers know them: never regenerated, never edited.
FROZEN_V1_SHA256 = {
    "event.v1.schema.json": "c5f5b49ba6ad75358fd959153ffcc3bda4c7b1c461e049bb53fa11e4fef6dd0c",
    "session.ended.v1.schema.json": "95ade9de3adc2dbc6587c70c659c6d26343bfc680547f7c567f9050dc6c8dd1a",
    "session.started.v1.schema.json": "8482366aa943bbab92b1f398b913f2d8d77fc23018a54cc260d2ae239512845c",
    "turn.completed.v1.schema.json": "c0146f74eec5b8f244edf53fa41ad224b982e998d1abb63b7b23ba8e9ef3f0f0",
    "turn.partial.v1.schema.json": "a1f37e13815ca76b13c3e7bbb9e3fc08b833625ee6f4e40c56a38a769b34e4a4",
}
#: The released version-2 files, as v2 readers know them: never regenerated, never edited.
FROZEN_V2_SHA256 = {
    "event.v2.schema.json": "4d9d21f1038e25fcd9ba1b53b9a4b331f2842db2f125d405308c5147ae5ebee2",
    "session.ended.v2.schema.json": "903d734134fc113b8804f91fb3443c2105b1f445835d6e56b16760e56b0d72fa",
    "session.started.v2.schema.json": "6cbf673e4f58f9b6c292b1ff352f2cf55314a7f17e3d8492cfa56909fe55fb4a",
    "turn.completed.v2.schema.json": "a541f89a72b19d2f1ece13eaa4156aab928064115612f46b1feff09cc31d65c1",
    "turn.partial.v2.schema.json": "252d0d271f0f3821974b81b6e885d9c47cd853e8dc75b65adb709714a3390f97",
}


def schema(name):
    return json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))


def schema_errors(payload, name):
    """The JSON Schema violations of ``payload`` (bytes) under ``schemas/json/<name>``: [] if valid."""
    validator = jsonschema.Draft202012Validator(schema(name), format_checker=jsonschema.FormatChecker())
    return [e.message for e in validator.iter_errors(json.loads(payload))]


def test_checked_in_json_schemas_match_the_model():
    rendered = render_schemas()
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in SCHEMA_DIR.glob(f"*.v{SCHEMA_VERSION}.schema.json")}
    assert on_disk == rendered, "run `python -m turnlog.schemas.generate` and commit schemas/json"


def test_every_earlier_version_is_frozen_and_nothing_else_lies_beside_the_files():
    frozen = frozen_hashes()
    assert set(frozen) == {v for v in SCHEMA_VERSIONS if v < SCHEMA_VERSION}, (
        "run `python -m turnlog.schemas.generate`: it freezes the previous version's files"
    )
    assert (frozen[1], frozen[2]) == (FROZEN_V1_SHA256, FROZEN_V2_SHA256)  # the released files, whatever frozen.json says
    for version, files in frozen.items():
        on_disk = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in SCHEMA_DIR.glob(f"*.v{version}.schema.json")}
        assert on_disk == files, f"the v{version} files are the old readers' contract: restore them from git"
    frozen_names = {name for files in frozen.values() for name in files}
    assert {p.name for p in SCHEMA_DIR.iterdir()} == frozen_names | set(render_schemas()) | {FROZEN_FILE.name}


def test_the_generator_freezes_a_version_once_and_never_changes_a_frozen_one(tmp_path, monkeypatch):
    from turnlog.schemas import generate

    for p in SCHEMA_DIR.glob("*.json"):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    monkeypatch.setattr(generate, "SCHEMA_DIR", tmp_path)
    monkeypatch.setattr(generate, "FROZEN_FILE", tmp_path / "frozen.json")
    assert generate.freeze_previous() == []  # every version below the current one is frozen already
    # The next version: the current one's files become the previous version's and are frozen.
    monkeypatch.setattr(generate, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setattr(generate, "SCHEMA_VERSIONS", (*SCHEMA_VERSIONS, SCHEMA_VERSION + 1))
    assert generate.freeze_previous() == [SCHEMA_VERSION]
    frozen = generate.frozen_hashes()
    assert set(frozen[SCHEMA_VERSION]) == {p.name for p in SCHEMA_DIR.glob(f"*.v{SCHEMA_VERSION}.schema.json")}
    assert (frozen[1], frozen[2]) == (FROZEN_V1_SHA256, FROZEN_V2_SHA256)
    assert generate.freeze_previous() == []
    (tmp_path / "frozen.json").unlink()
    edited = next(tmp_path.glob(f"event.v{SCHEMA_VERSION}.schema.json"))
    monkeypatch.setattr(generate, "_committed", lambda path: b"{}" if path == edited else None)
    with pytest.raises(ValueError, match="differs from the committed file"):
        generate.freeze_previous()  # a released version is frozen as released, not as edited since
    assert not (tmp_path / "frozen.json").exists()
    monkeypatch.setattr(generate, "_committed", lambda path: None)
    for p in tmp_path.glob(f"*.v{SCHEMA_VERSION}.schema.json"):
        p.unlink()
    with pytest.raises(FileNotFoundError, match=f"version {SCHEMA_VERSION}"):
        generate.freeze_previous()


def test_every_event_type_round_trips_and_satisfies_its_json_schema():
    events = EventFactory("s-1")
    samples = [
        events.started(), events.partial(1, 0, "hel"), events.completed(2, 0, "hello"),
        events.completed(3, 1, "I was sa", barged_in=True), events.ended(4, last_turn=1),
    ]
    for event in samples:
        payload = encode_event(event)
        assert decode_event(payload) == event
        assert schema_errors(payload, "event.v2.schema.json") == []
        assert schema_errors(payload, f"{type(event).__struct_config__.tag}.v2.schema.json") == []


def test_a_barged_in_turn_is_version_2_and_every_other_event_stays_version_1():
    f = EventFactory("s-1")
    cut = f.completed(2, 0, "Sorry, I", barged_in=True)
    whole = f.completed(3, 1, "Go ahead.")
    assert (cut.schema_version, cut.barged_in) == (2, True)
    assert (whole.schema_version, whole.barged_in) == (1, False)
    assert [e.schema_version for e in (f.started(), f.partial(1, 0, "x"), f.ended(4))] == [1, 1, 1]
    assert json.loads(encode_event(cut))["barged_in"] is True
    assert "barged_in" not in json.loads(encode_event(whole))  # the flag is written only when set
    assert json.loads(encode_event(whole))["schema_version"] == 1  # the version always is


# -- rolling upgrade: old (v1) and new (v2) readers and writers side by side --------------


def new_writer_samples():
    """A v2 writer's events: every type, with fields at and away from their defaults."""
    f = EventFactory("s-up")
    zero_tokens = msgspec.structs.replace(f.completed(3, 1, "no tokens"), input_tokens=0, output_tokens=0)
    with_tools = msgspec.structs.replace(f.completed(4, 2, "looked it up"), tool_calls=[ToolCall(name="lookup", arguments={"q": 1})])
    return [f.started(), f.partial(1, 0, "he"), f.completed(2, 0, "hello"), zero_tokens, with_tools, f.ended(5, last_turn=2)]


def as_v1(event):
    """The same event built by the released v1 model (the old writer)."""
    cls = getattr(v1, type(event).__name__)
    fields = {name: getattr(event, name) for name in cls.__struct_fields__ if name != "schema_version"}
    if fields.get("tool_calls") is not None:
        fields["tool_calls"] = [v1.ToolCall(name=c.name, arguments=c.arguments, result=c.result) for c in fields["tool_calls"]]
    return cls(**fields)


def test_an_old_reader_reads_every_new_event_that_does_not_use_v2():
    for event in new_writer_samples():
        payload = encode_event(event)
        tag = type(event).__struct_config__.tag
        assert schema_errors(payload, "event.v1.schema.json") == [], tag
        assert schema_errors(payload, f"{tag}.v1.schema.json") == [], tag
        assert v1.decode_event(payload) == as_v1(event)


def test_an_old_reader_rejects_a_barged_in_turn_on_its_version_into_the_dlq():
    payload = encode_event(EventFactory("s-up").completed(2, 0, "Sorry, I", barged_in=True))
    errors = schema_errors(payload, "turn.completed.v1.schema.json")
    assert any("2 is not one of [1]" in e for e in errors) and any("barged_in" in e for e in errors)
    assert schema_errors(payload, "event.v1.schema.json") != []
    # The old decoder raises the one error every stage catches and dead-letters,
    # naming the version: the DLQ record says why.
    with pytest.raises(v1.EventValidationError) as caught:
        v1.decode_event(payload)
    assert caught.value.reason == "Invalid enum value 2 - at `$.schema_version`"


def test_a_new_reader_reads_every_old_event():
    for event in new_writer_samples():
        old = as_v1(event)
        payload = v1.encode_event(old)  # the old writer writes every field, defaults too
        assert b'"schema_version":1' in payload
        decoded = decode_event(payload)
        assert decoded == event and decoded.schema_version == 1
        assert schema_errors(payload, "event.v2.schema.json") == []
    old_turn = v1.encode_event(as_v1(new_writer_samples()[2]))
    assert b"barged_in" not in old_turn and decode_event(old_turn).barged_in is False


def test_the_v2_json_schema_holds_the_models_version_rule():
    raw = json.loads(encode_event(EventFactory("s-1").completed(2, 0, "Sorry, I", barged_in=True)))
    assert schema_errors(json.dumps(raw), "turn.completed.v2.schema.json") == []
    raw["schema_version"] = 1
    assert schema_errors(json.dumps(raw), "turn.completed.v2.schema.json") != []
    assert schema_errors(json.dumps(raw), "event.v2.schema.json") != []
    raw["barged_in"] = False  # an explicit false uses nothing new
    assert schema_errors(json.dumps(raw), "turn.completed.v2.schema.json") == []
    assert decode_event(json.dumps(raw)).schema_version == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"seq": -1}, "seq"),
        ({"type": "turn.exploded"}, "type"),
        ({"unexpected": 1}, "unexpected"),
        ({"emitted_at": "2026-01-01T00:00:00"}, "emitted_at"),
        ({"session_id": ""}, "session_id"),
        ({"schema_version": SCHEMA_VERSION + 1}, "schema_version"),
        ({"schema_version": 0}, "schema_version"),
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


def test_a_barged_in_turn_labelled_version_1_is_rejected():
    raw = json.loads(encode_event(EventFactory("s-1").completed(2, 0, "Sorry, I", barged_in=True)))
    raw["schema_version"] = 1
    with pytest.raises(EventValidationError, match="barged_in needs schema_version 2"):
        decode_event(json.dumps(raw))
    del raw["schema_version"]  # left out: the model fills in the version the fields need
    assert decode_event(json.dumps(raw)).schema_version == 2


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
