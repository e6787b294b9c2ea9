"""The event model's bounds on free-form values and on nesting (schemas/events.py, "Bounds on free-form values"):
each limit at decode_event and at the recorder, at the limit and one past it; the same answer at any stack depth;
and, property-based, that decode_event never raises anything but EventValidationError."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnlog.producers import InvalidTurnError
from turnlog.producers.recorder import RecordedSession
from turnlog.schemas import EVENT_TYPES, EventValidationError, SessionStarted, decode_event, encode_event
from turnlog.schemas.events import (
    MAX_EVENT_DEPTH,
    MAX_METADATA_BYTES,
    MAX_TOOL_VALUE_BYTES,
    MAX_VALUE_DEPTH,
    nesting_exceeds,
)
from turnlog.schemas.headers import peek_event_type

from tests.support import EventFactory
from tests.unit.test_recorder_validation import RecordingSend

f = EventFactory("s-bounds")


def nested(depth: int, leaf: bytes = b"1") -> bytes:
    """A JSON array ``depth`` levels deep around ``leaf``."""
    return b"[" * depth + leaf + b"]" * depth


def with_member(event, name: str, raw: bytes) -> bytes:
    """``event``'s JSON with one more member (raw JSON): its defaults are left out on the wire, so it is new."""
    return encode_event(event)[:-1] + b',"' + name.encode() + b'":' + raw + b"}"


def started_with_metadata(raw: bytes) -> bytes:
    return with_member(f.started(), "metadata", raw)


def completed_with_call(arguments: bytes = b"{}", result: bytes = b"null") -> bytes:
    call = b'{"name":"lookup","arguments":' + arguments + b',"result":' + result + b"}"
    return with_member(f.completed(1, 0, "done"), "tool_calls", b"[" + call + b"]")


def object_of_depth(depth: int) -> bytes:
    """A JSON object nested ``depth`` levels deep (the object itself is level 1)."""
    return b'{"k":' + nested(depth - 1) + b"}"


def object_of_size(size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes, compact."""
    return b'{"k":"' + b"x" * (size - len(b'{"k":""}')) + b'"}'


def string_of_size(size: int) -> bytes:
    return b'"' + b"x" * (size - 2) + b'"'


def refusal(data) -> str | None:
    """None if ``data`` decodes, else the EventValidationError's reason."""
    try:
        decode_event(data)
    except EventValidationError as e:
        return e.reason
    return None


# -- the limits at decode_event ------------------------------------------------------------------------


def test_metadata_nested_to_the_limit_decodes_and_one_deeper_is_refused_naming_field_and_limit():
    assert refusal(started_with_metadata(object_of_depth(MAX_VALUE_DEPTH))) is None
    reason = refusal(started_with_metadata(object_of_depth(MAX_VALUE_DEPTH + 1)))
    assert reason is not None and "metadata" in reason and str(MAX_VALUE_DEPTH) in reason


def test_tool_arguments_and_result_nested_to_the_limit_decode_and_one_deeper_are_refused():
    assert refusal(completed_with_call(arguments=object_of_depth(MAX_VALUE_DEPTH))) is None
    assert refusal(completed_with_call(result=nested(MAX_VALUE_DEPTH))) is None
    # They sit 3 levels down the event: one deeper is the whole event past MAX_EVENT_DEPTH.
    for data in (completed_with_call(arguments=object_of_depth(MAX_VALUE_DEPTH + 1)),
                 completed_with_call(result=nested(MAX_VALUE_DEPTH + 1))):
        reason = refusal(data)
        assert reason is not None and str(MAX_EVENT_DEPTH) in reason and str(MAX_VALUE_DEPTH) in reason


def test_metadata_of_the_limits_size_decodes_and_one_byte_more_is_refused():
    assert refusal(started_with_metadata(object_of_size(MAX_METADATA_BYTES))) is None
    reason = refusal(started_with_metadata(object_of_size(MAX_METADATA_BYTES + 1)))
    assert reason is not None and "metadata" in reason and str(MAX_METADATA_BYTES) in reason


def test_tool_arguments_and_result_of_the_limits_size_decode_and_one_byte_more_is_refused():
    assert refusal(completed_with_call(arguments=object_of_size(MAX_TOOL_VALUE_BYTES))) is None
    assert refusal(completed_with_call(result=string_of_size(MAX_TOOL_VALUE_BYTES))) is None
    reason = refusal(completed_with_call(arguments=object_of_size(MAX_TOOL_VALUE_BYTES + 1)))
    assert reason is not None and "arguments" in reason and str(MAX_TOOL_VALUE_BYTES) in reason
    reason = refusal(completed_with_call(result=string_of_size(MAX_TOOL_VALUE_BYTES + 1)))
    assert reason is not None and "result" in reason and str(MAX_TOOL_VALUE_BYTES) in reason


def test_the_size_is_the_compact_encoding_not_the_bytes_on_the_wire():
    # Whitespace and escapes on the wire do not count: the value is measured as encode_event writes it.
    padded = b'{ "k" :   "' + b"x" * (MAX_METADATA_BYTES - len(b'{"k":""}')) + b'"   }'
    assert len(padded) > MAX_METADATA_BYTES and refusal(started_with_metadata(padded)) is None


def test_a_refusal_names_the_limit_never_the_content():
    secret = b"hunter2-secret"
    for data in (started_with_metadata(b'{"k":' + nested(MAX_VALUE_DEPTH, b'"' + secret + b'"') + b"}"),
                 started_with_metadata(b'{"k":"' + secret + b"x" * MAX_METADATA_BYTES + b'"}'),
                 b'{"metadata":' + nested(5000, b'"' + secret + b'"') + b"}"):
        reason = refusal(data)
        assert reason is not None and secret.decode() not in reason


@pytest.mark.parametrize("depth", [MAX_EVENT_DEPTH + 1, 1_000, 100_000])
def test_a_record_nested_far_past_the_limit_is_refused_before_msgspec_sees_it(depth):
    for data in (started_with_metadata(b'{"k":' + nested(depth) + b"}"), nested(depth), b"[" * depth,
                 b'{"type":"session.started","x":' + b"{" * depth):
        reason = refusal(data)
        assert reason is not None and str(MAX_EVENT_DEPTH) in reason
    assert peek_event_type(b'{"x":' + nested(depth) + b',"type":"turn.partial"}') is None


def test_any_failure_to_decode_one_record_is_an_event_validation_error():
    # A tombstone, not UTF-8 (bytes and str), not JSON, the wrong type of input.
    for data in (None, b"", b"\xff\xfe", "\ud800", b"{", 5, b"[]", b'"x"'):
        assert refusal(data) is not None
    event = f.started()
    assert decode_event(bytearray(encode_event(event))) == decode_event(encode_event(event).decode()) == event


def test_brackets_inside_strings_do_not_count_and_escaped_quotes_do_not_end_a_string():
    deep_text = b'"' + b"[{" * 500 + b'\\"' + b"[" * 100 + b'"'
    assert not nesting_exceeds(b'{"k":' + deep_text + b"}", 3)
    assert refusal(started_with_metadata(b'{"k":' + deep_text + b"}")) is None
    # An escaped backslash ends the escape: the quote after it closes the string, and the brackets count.
    assert nesting_exceeds(b'["\\\\"' + b"[" * 10, 5)
    assert not nesting_exceeds(b'["\\\\\\"' + b"[" * 10 + b'"]', 5)


def test_a_value_too_deep_is_refused_on_construction_as_well():
    deep = {"k": json.loads(nested(MAX_VALUE_DEPTH))}
    cyclic: dict = {}
    cyclic["self"] = cyclic
    for metadata in (deep, cyclic):
        with pytest.raises(ValueError, match=f"metadata is nested deeper than {MAX_VALUE_DEPTH} levels"):
            SessionStarted(**{**msgspec.structs.asdict(f.started()), "metadata": metadata})


# -- the same answer at any stack depth ----------------------------------------------------------------


def at_stack_depth(frames: int, call):
    """``call()`` from ``frames`` Python frames deeper than here."""
    if frames == 0:
        return call()
    return at_stack_depth(frames - 1, call)


def outcome(data):
    try:
        return ("event", decode_event(data))
    except EventValidationError as e:
        return ("refused", e.reason)


DEPTH_SAMPLES = [
    started_with_metadata(object_of_depth(MAX_VALUE_DEPTH)),
    started_with_metadata(object_of_depth(MAX_VALUE_DEPTH + 1)),
    completed_with_call(result=nested(MAX_VALUE_DEPTH)),
    completed_with_call(result=nested(MAX_VALUE_DEPTH + 1)),
    started_with_metadata(b'{"k":' + nested(900) + b"}"),
    started_with_metadata(b'{"k":' + nested(990) + b"}"),
    nested(5_000),
]


def test_decoding_800_frames_deep_gives_what_decoding_at_the_top_gives():
    at_top = [outcome(data) for data in DEPTH_SAMPLES]
    deep = at_stack_depth(800, lambda: [outcome(data) for data in DEPTH_SAMPLES])
    assert deep == at_top
    assert [kind for kind, _ in at_top] == ["event", "refused", "event", "refused", "refused", "refused", "refused"]


def test_the_recorder_refuses_the_same_at_any_stack_depth():
    metadata = {"k": json.loads(nested(MAX_VALUE_DEPTH - 1))}  # 32 levels: accepted
    too_deep = {"k": json.loads(nested(MAX_VALUE_DEPTH))}

    def emit(value):
        session = RecordedSession(RecordingSend(), "s-deep", fleet="f", epoch=0, next_seq=0, next_turn_index=0)
        try:
            session._emit(SessionStarted, fleet="f", agent_id="a", started_at=f.started().started_at, metadata=value)
        except InvalidTurnError as e:
            return str(e)
        return None

    at_top = [emit(metadata), emit(too_deep)]
    assert at_top[0] is None and at_top[1] is not None
    assert at_stack_depth(800, lambda: [emit(metadata), emit(too_deep)]) == at_top


# -- the limits at the recorder ------------------------------------------------------------------------


@pytest.fixture
def recorder_session():
    return RecordedSession(RecordingSend(), "s-1", fleet="f", epoch=0, next_seq=1, next_turn_index=0)


async def start(metadata):
    """What ``SessionRecorder.start_session`` spools for ``metadata``: its session.started goes through
    ``RecordedSession._emit``, the recorder's one check (RecordingSend keeps what would be spooled)."""
    session = RecordedSession(RecordingSend(), "s-meta", fleet="f", epoch=0, next_seq=0, next_turn_index=0)
    session._emit(SessionStarted, fleet="f", agent_id="a", started_at=f.started().started_at, metadata=dict(metadata))
    return session._recorder.sent


async def test_the_recorder_accepts_metadata_at_the_limits_and_refuses_one_past_each():
    assert len(await start({"k": json.loads(nested(MAX_VALUE_DEPTH - 1))})) == 1
    assert len(await start(json.loads(object_of_size(MAX_METADATA_BYTES)))) == 1
    with pytest.raises(InvalidTurnError, match=f"metadata is nested deeper than {MAX_VALUE_DEPTH}"):
        await start({"k": json.loads(nested(MAX_VALUE_DEPTH))})
    with pytest.raises(InvalidTurnError, match=f"the limit is {MAX_METADATA_BYTES} bytes"):
        await start(json.loads(object_of_size(MAX_METADATA_BYTES + 1)))
    with pytest.raises(InvalidTurnError, match="nested deeper"):
        await start({"k": json.loads(nested(900))})


async def test_the_recorder_accepts_tool_values_at_the_limits_and_refuses_one_past_each(recorder_session):
    session = recorder_session
    at_limit = [
        {"name": "a", "arguments": {"k": json.loads(nested(MAX_VALUE_DEPTH - 1))}},
        {"name": "b", "result": json.loads(nested(MAX_VALUE_DEPTH))},
        {"name": "c", "arguments": json.loads(object_of_size(MAX_TOOL_VALUE_BYTES))},
        {"name": "d", "result": json.loads(string_of_size(MAX_TOOL_VALUE_BYTES))},
    ]
    await session.complete_turn(0, "A", "ok", tool_calls=at_limit)
    sent = decode_event(session._recorder.sent[-1])
    assert [c.name for c in sent.tool_calls] == ["a", "b", "c", "d"]
    past = [
        ({"name": "a", "arguments": {"k": json.loads(nested(MAX_VALUE_DEPTH))}}, "arguments is nested deeper"),
        ({"name": "b", "result": json.loads(nested(MAX_VALUE_DEPTH + 1))}, "result is nested deeper"),
        ({"name": "c", "arguments": json.loads(object_of_size(MAX_TOOL_VALUE_BYTES + 1))}, "arguments is"),
        ({"name": "d", "result": json.loads(string_of_size(MAX_TOOL_VALUE_BYTES + 1))}, "result is"),
    ]
    for call, match in past:
        with pytest.raises(InvalidTurnError, match=match):
            await session.complete_turn(1, "A", "no", tool_calls=[call])
    assert len(session._recorder.sent) == 1 and session.next_seq == 2


# -- property: nothing but a valid event or EventValidationError ----------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=40,
)
#: Deep values: a chain of objects and arrays (every ``every``-th an object) around any value, from shallow to
#: far past the limits and Python's recursion limit; depths near the limits are drawn as often as the rest.
depths = st.integers(0, 1_500) | st.integers(MAX_VALUE_DEPTH - 2, MAX_EVENT_DEPTH + 2)
deep_values = st.builds(lambda depth, every, leaf: _wrap(leaf, depth, every), depths, st.integers(1, 4), json_values)


def _wrap(leaf, depth: int, every: int):
    value = leaf
    for i in range(depth):
        value = {"k": value} if i % every == 0 else [value]
    return value


huge_values = st.sampled_from([10**400, -(10**30), 2**64, 1e308, -0.0, "\x00", "\ud800", "x" * 300_000])
any_value = json_values | deep_values | huge_values
valid_bases = st.sampled_from([encode_event(e) for e in (
    f.started(), f.partial(1, 0, "hel"), f.completed(2, 0, "hello"), f.ended(3, last_turn=0),
)])
FIELDS = ["metadata", "tool_calls", "arguments", "result", "seq", "type", "schema_version", "text", "session_id",
          "emitted_at", "barged_in", "unknown"]


def _encoded(value) -> bytes:
    """``value`` as JSON text, without recursion limits of the stdlib (msgspec; deep values by hand)."""
    depth = 0
    shell = []
    while isinstance(value, (dict, list)) and len(value) == 1 and depth < 2_000:
        if isinstance(value, dict):
            ((key, value),) = value.items()
            shell.append((b"{" + json.dumps(key).encode() + b":", b"}"))
        else:
            (value,) = value
            shell.append((b"[", b"]"))
        depth += 1
    try:
        inner = msgspec.json.encode(value)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError, UnicodeEncodeError):
        inner = json.dumps(value, default=str).encode("utf-8", "surrogatepass")
    return b"".join(o for o, _ in shell) + inner + b"".join(c for _, c in reversed(shell))


def assert_decodes_or_is_refused(data) -> None:
    try:
        event = decode_event(data)
    except EventValidationError as e:
        assert isinstance(e.reason, str) and e.reason
        return
    assert isinstance(event, EVENT_TYPES)
    assert decode_event(encode_event(event)) == event  # a valid event stays valid


PROPERTY_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(st.binary(max_size=2_000))
def test_any_bytes_decode_to_an_event_or_are_refused(data):
    assert_decodes_or_is_refused(data)


@PROPERTY_SETTINGS
@given(valid_bases, st.sampled_from(FIELDS), any_value)
def test_an_event_with_any_value_in_any_field_decodes_or_is_refused(base, field, value):
    if field in ("arguments", "result"):
        call = b'{"name":"t","' + field.encode() + b'":' + _encoded(value) + b"}"
        data = with_member(f.completed(1, 0, "x"), "tool_calls", b"[" + call + b"]")
    else:
        data = base[:-1] + b',"' + field.encode() + b'":' + _encoded(value) + b"}"
    assert_decodes_or_is_refused(data)
    assert_decodes_or_is_refused(data.decode("utf-8", "surrogateescape"))


@PROPERTY_SETTINGS
@given(valid_bases, st.integers(min_value=0, max_value=400), st.binary(max_size=40))
def test_a_truncated_or_spliced_event_decodes_or_is_refused(base, cut, noise):
    assert_decodes_or_is_refused(base[:cut] + noise + base[cut:])
    assert_decodes_or_is_refused(base[:cut])


@PROPERTY_SETTINGS
@given(deep_values)
def test_the_raw_scan_agrees_with_the_depth_of_any_value(value):
    data = _encoded(value)
    assert nesting_exceeds(data, MAX_EVENT_DEPTH) == (_depth(value) > MAX_EVENT_DEPTH)


def _depth(value) -> int:
    depth, level = 0, [value]
    while True:
        containers = [v for v in level if isinstance(v, (dict, list))]
        if not containers:
            return depth
        depth += 1
        level = [c for v in containers for c in (v.values() if isinstance(v, dict) else v)]


#: JSON values that decode to themselves (no NaN, integers within msgspec's 64-bit range).
exact_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=20,
)


@PROPERTY_SETTINGS
@given(st.builds(lambda depth, every, leaf: _wrap(leaf, depth, every), depths, st.integers(1, 4), exact_json))
def test_metadata_is_refused_exactly_when_nested_past_the_limit_and_otherwise_kept_as_is(value):
    metadata = {"m": value}
    reason = refusal(started_with_metadata(_encoded(metadata)))
    if _depth(metadata) > MAX_VALUE_DEPTH:
        assert reason is not None and str(MAX_VALUE_DEPTH) in reason
    else:
        assert reason is None
        assert decode_event(started_with_metadata(_encoded(metadata))).metadata == metadata
