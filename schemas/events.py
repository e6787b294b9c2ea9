"""Event model, version 4 (see docs/design.md, "Events").

Every event carries the envelope ``schema_version``, ``event_id``, ``type``,
``session_id``, ``seq``, ``epoch``, ``producer_id`` and ``emitted_at`` (UTC).
``seq`` is the per-session order key, strictly increasing from 0; ``epoch``
grows by one each time a new process resumes the session (fencing).

Events travel as JSON; :func:`decode_event` validates bytes against this model
(the current version's JSON Schema files in ``schemas/json/`` are generated
from it by ``python -m turnlog.schemas.generate``).

Schema evolution
----------------
Version 1 is the original model. Version 2 adds one field,
``TurnCompleted.barged_in`` (the turn was cut short by the other speaker and
holds the words actually spoken; not the same as a turn left ``interrupted``
by a crash). Version 3 adds ``sealed`` to the three event types that carry
content (see "Sealed content" below). Version 4 adds ``TurnCompleted.kind``:
what the turn was where the framework tells it apart (``typed``, ``summary``,
``injected``, ``blocked``; absent: ``spoken``, see :class:`TurnKind`), and
``TurnCompleted.out_of_context`` (True: the turn was said, but the framework
kept it out of the LLM's context, so a rebuilt context leaves it out; absent:
in the context), both among the turn's ``stored_attributes``. The rules, so that a rolling upgrade
never stops a consumer:

* An event's ``schema_version`` is the lowest version that can carry it
  (``required_version()``). A writer leaves it out of the constructor and
  the model fills it in: a ``turn.completed`` with ``barged_in=True`` is
  version 2, every other event is still version 1.
* A field at its default is not written (``omit_defaults``), so
  ``barged_in: false`` never appears on the wire and a version-1 event from a
  v2 writer is valid under the v1 model and the v1 JSON Schema.
* An old (v1) reader has ``schema_version: Literal[1]`` and
  ``forbid_unknown_fields``: it rejects a version-2 event on its
  ``schema_version`` (``EventValidationError``: "Invalid enum value 2 - at
  `$.schema_version`"): the sequencer, the sink and the analytics projection
  send such a record to the DLQ with that reason (the finalizer and the live followers skip it), and
  none of them stops. A v2 reader reads every v1 event (``barged_in``
  defaults to False).
* A reader accepts every version it knows (``SCHEMA_VERSIONS``). It rejects a version
  it does not know, and an event labelled lower than its fields need
  (``schema_version: 1`` with ``barged_in: true``).
* Upgrade the readers first (sequencer, sink, finalizer, analytics, API and
  ``tail``, replay and verify), then the writers (the agents' recorders).
  The sequencer forwards the bytes it was given, so the transcript topic holds
  v2 events only once a v2 recorder writes them.
* The JSON Schema files of a released version are frozen: the
  ``*.v1.schema.json`` files are the v1 readers' contract and are never
  regenerated; the generator writes the current version's files.

The next field follows the same steps, all in this module: give it a falsy
default, list it in its event type's ``added_in`` with the new version, raise
``SCHEMA_VERSION``, add the version to ``SCHEMA_VERSIONS`` and the
``schema_version`` literal; then run ``python -m turnlog.schemas.generate``,
which freezes the previous version's JSON Schema files (``json/frozen.json``)
and writes the new version's. A turn's optional field that the store should
keep and give back also goes in its type's ``stored_attributes``: the sink
stores it in the turn's ``attributes`` (no new column, no migration), and the
readers, the resume grant and the audit fold carry it.

Sealed content
--------------
An encrypted event (version 3) carries its content, and only its content, in
``sealed`` (:class:`Sealed`): ``TurnPartial.text``, ``TurnCompleted.text``
and ``tool_calls``, ``SessionStarted.metadata``. Those fields then hold their
empty values (``text`` is ``""``), and everything else stays in clear (ids,
seq, epoch, type, turn index, speaker, times, tokens, ``barged_in``, fleet,
agent, reasons), so the sequencer orders, de-duplicates and fences without a
key. :func:`content_of` gives the bytes a writer seals (the content fields as
a JSON object) and :func:`with_content` puts opened bytes back, checking them
as the decoder checks a plain event. The cryptography itself is in
``turnlog.crypto.envelope``; this model knows only the shape.

Bounds on free-form values
--------------------------
``SessionStarted.metadata``, ``ToolCall.arguments`` and ``ToolCall.result``
hold any JSON. Each nests at most :data:`MAX_VALUE_DEPTH` (32) levels (an
object or array is one level: ``{}`` is 1 deep, ``{"a": [1]}`` 2, a scalar 0)
and encodes (compact JSON, as :func:`encode_event` writes it) to at most
:data:`MAX_METADATA_BYTES` (64 KiB) for ``metadata`` and
:data:`MAX_TOOL_VALUE_BYTES` (256 KiB) for each ``arguments`` and ``result``.
The struct checks them (``__post_init__``, on construction and on decoding),
so the recorder refuses what every reader would.

:func:`decode_event` first measures the raw JSON's nesting with a linear scan
that does not recurse, and refuses a document nested deeper than
:data:`MAX_EVENT_DEPTH` (the values' bound plus the 3 levels they sit under)
before msgspec, which decodes ``Any`` recursively, sees it. So a record
decodes, or is refused, the same way whatever the caller's stack depth: a
deeply nested record cannot raise ``RecursionError`` in one reader and pass in
another. Any failure to decode one record is an :class:`EventValidationError`.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Final, Literal

import msgspec

from turnlog.schemas.exceptions import EventValidationError
from turnlog.schemas.session_keys import AGENT_SESSION_ID_PATTERN, MAX_SESSION_KEY

__all__ = [
    "SCHEMA_VERSION",
    "SCHEMA_VERSIONS",
    "MAX_TEXT_CHARS",
    "MAX_VALUE_DEPTH",
    "MAX_METADATA_BYTES",
    "MAX_TOOL_VALUE_BYTES",
    "MAX_EVENT_DEPTH",
    "Event",
    "SessionStarted",
    "TurnPartial",
    "TurnCompleted",
    "turn_attributes",
    "TurnKind",
    "SessionEnded",
    "ToolCall",
    "Sealed",
    "MAX_SEALED_BYTES",
    "CONTENT_FIELDS",
    "content_of",
    "without_content",
    "with_content",
    "encode_event",
    "decode_event",
    "EVENT_TYPES",
]

#: The newest version this model reads and writes.
SCHEMA_VERSION: Final = 4
#: Every version this model reads.
SCHEMA_VERSIONS: Final = (1, 2, 3, 4)
#: Hard limit of the schema on a turn's text, in characters. The producer's own
#: (configurable, lower) limit is in bytes: ``TurnlogSettings.max_text_bytes``.
MAX_TEXT_CHARS: Final = 262_144
#: Deepest nesting of ``SessionStarted.metadata``, ``ToolCall.arguments`` and
#: ``ToolCall.result``: each object or array is one level (``{}`` is 1, a scalar 0).
MAX_VALUE_DEPTH: Final = 32
#: Largest ``SessionStarted.metadata``, in bytes of its compact JSON encoding.
MAX_METADATA_BYTES: Final = 65_536
#: Largest ``ToolCall.arguments``, and largest ``ToolCall.result``, each in bytes of its compact JSON encoding.
MAX_TOOL_VALUE_BYTES: Final = 262_144
#: Deepest nesting of a whole event's JSON: the free-form values sit at most 3 levels
#: down (the event object, the ``tool_calls`` array, a tool call object).
MAX_EVENT_DEPTH: Final = MAX_VALUE_DEPTH + 3
#: Largest ``Sealed.box``, in bytes (before base64): the content of one Kafka record at most.
MAX_SEALED_BYTES: Final = 1_048_576

SessionId = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_SESSION_KEY,
        pattern=AGENT_SESSION_ID_PATTERN,
        description="The session's key, '<fleet>:<id>' (schemas/session_keys.py; a session started before "
        "per-fleet keys: its bare id); the Kafka key of every event of the session.",
    ),
]
# Bounded by the store's column types (Postgres integer and bigint).
Int32 = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
Int64 = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
# No NUL characters: SQL text columns (Postgres TEXT) cannot store them.
_NO_NUL = r"^[^\x00]*$"
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=_NO_NUL)]
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS, pattern=_NO_NUL)]
UtcTime = Annotated[dt.datetime, msgspec.Meta(tz=True, description="RFC 3339 timestamp with offset (UTC)")]
# JSON Schema cannot state a nesting depth or an encoded size: the descriptions carry them,
# and the structs check them (_check_free_form).
Metadata = Annotated[
    dict[str, Any],
    msgspec.Meta(
        description=f"Free-form JSON object: nested at most {MAX_VALUE_DEPTH} levels, "
        f"at most {MAX_METADATA_BYTES} bytes as compact JSON."
    ),
]
ToolArguments = Annotated[
    dict[str, Any],
    msgspec.Meta(
        description=f"Free-form JSON object: nested at most {MAX_VALUE_DEPTH} levels, "
        f"at most {MAX_TOOL_VALUE_BYTES} bytes as compact JSON."
    ),
]
ToolResult = Annotated[
    Any,
    msgspec.Meta(
        description=f"Any JSON value: nested at most {MAX_VALUE_DEPTH} levels, "
        f"at most {MAX_TOOL_VALUE_BYTES} bytes as compact JSON."
    ),
]


#: Timestamps must fall in these years, so any UTC offset converts without overflow.
EARLIEST_YEAR, LATEST_YEAR = 1900, 9000


SchemaVersion = Annotated[
    Literal[1, 2, 3, 4],
    msgspec.Meta(description="Lowest model version that can carry the event; filled in by the model when omitted."),
]


class _Envelope(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True, tag_field="type"
):
    # UNSET only until __post_init__, which fills in required_version(): an
    # event always carries its version, on the wire and as an attribute.
    schema_version: SchemaVersion | msgspec.UnsetType = msgspec.UNSET
    event_id: uuid.UUID
    session_id: SessionId
    seq: Int64
    epoch: Int32
    producer_id: Name
    emitted_at: UtcTime

    #: Fields added after version 1, with the version that added each. Such a
    #: field has a falsy default (False, None, 0, empty) and an event uses it
    #: when its value is truthy.
    added_in: ClassVar[Mapping[str, int]] = {}
    #: A turn's optional fields that the store keeps as they are, in the turn's ``attributes``
    #: (one JSON object: no column per field), and gives back to readers and on resume
    #: (:func:`turn_attributes`). Each is one of ``added_in`` (a falsy default); metadata of the
    #: turn, never its content (content is what ``sealed`` encrypts).
    stored_attributes: ClassVar[tuple[str, ...]] = ()

    def required_version(self) -> int:
        """The lowest schema version whose model has every field this event uses."""
        return max((version for name, version in self.added_in.items() if getattr(self, name)), default=1)

    def __post_init__(self) -> None:
        if self.schema_version is msgspec.UNSET:
            msgspec.structs.force_setattr(self, "schema_version", self.required_version())
        else:
            for name, version in self.added_in.items():
                if getattr(self, name) and self.schema_version < version:
                    raise ValueError(f"{name} needs schema_version {version}, the event says {self.schema_version}")
        # Python's "$" also matches before a final newline; JSON Schema's does not.
        if self.session_id.endswith("\n"):
            raise ValueError("session_id ends with a newline")
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if isinstance(value, dt.datetime) and not EARLIEST_YEAR <= value.year <= LATEST_YEAR:
                raise ValueError(f"{name} is outside the years {EARLIEST_YEAR}..{LATEST_YEAR}")


class Sealed(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An event's content, encrypted (version 3; module docstring, "Sealed content").

    ``kek``: the id of the key encryption key that wrapped the data key (16 hex
    characters); ``key``: the session epoch's data key, wrapped for that KEK
    (HPKE, RFC 9180); ``box``: the content, encrypted with the data key
    (AES-256-GCM: 12-byte nonce, ciphertext, 16-byte tag). On the wire both
    byte strings are base64.
    """

    kek: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{16}$")]
    key: Annotated[bytes, msgspec.Meta(min_length=1, max_length=512)]
    box: Annotated[bytes, msgspec.Meta(min_length=28, max_length=MAX_SEALED_BYTES)]


class SessionStarted(_Envelope, frozen=True, kw_only=True, tag="session.started"):
    """First event of a session (seq 0). ``sealed`` (version 3): ``metadata`` encrypted."""

    fleet: Name
    agent_id: Name
    started_at: UtcTime
    metadata: Metadata = {}
    sealed: Sealed | None = None

    added_in: ClassVar[Mapping[str, int]] = {"sealed": 3}

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_free_form("metadata", self.metadata, MAX_METADATA_BYTES)
        if self.sealed is not None and self.metadata:
            raise ValueError("a sealed event carries its metadata in sealed only")


class TurnPartial(_Envelope, frozen=True, kw_only=True, tag="turn.partial"):
    """The whole text of an unfinished turn so far (not a delta). ``sealed`` (version 3): ``text`` encrypted."""

    turn_index: Int32
    speaker: Name
    text: Text
    started_at: UtcTime
    sealed: Sealed | None = None

    added_in: ClassVar[Mapping[str, int]] = {"sealed": 3}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sealed is not None and self.text:
            raise ValueError("a sealed event carries its text in sealed only")


class ToolCall(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One tool call of a turn: the tool's name, its arguments and its result."""

    name: Name
    arguments: ToolArguments = {}
    result: ToolResult = None

    def __post_init__(self) -> None:
        _check_free_form("arguments", self.arguments, MAX_TOOL_VALUE_BYTES)
        _check_free_form("result", self.result, MAX_TOOL_VALUE_BYTES)


class TurnKind(StrEnum):
    """What a turn was, where the framework tells it apart (``TurnCompleted.kind``, version 4).

    ``SPOKEN`` is the default and is never written: a turn without ``kind`` was spoken
    (or its framework does not tell). The others are written as their value."""

    #: Said aloud (heard through speech-to-text, or spoken by the bot): the default.
    SPOKEN = "spoken"
    #: Typed by the user in a text channel beside the voice (e.g. Pipecat's RTVI ``send-text``).
    TYPED = "typed"
    #: A synthetic summary standing for earlier turns (e.g. a summarization middleware's message).
    SUMMARY = "summary"
    #: Put into the conversation by the application, not said by the speaker (e.g. a message appended to the context).
    INJECTED = "injected"
    #: An answer the framework blocked (e.g. a tripped guardrail): kept for the record, not part of the context.
    BLOCKED = "blocked"


#: ``TurnCompleted.kind`` on the wire: a :class:`TurnKind` other than ``spoken`` (absent means spoken).
WrittenKind = Annotated[
    Literal["typed", "summary", "injected", "blocked"],
    msgspec.Meta(description="What the turn was, where the framework tells it apart; absent: spoken."),
]


class TurnCompleted(_Envelope, frozen=True, kw_only=True, tag="turn.completed"):
    """A finished turn; ``input_tokens``/``output_tokens`` are counts, not bytes.

    ``barged_in`` (version 2): the other speaker cut the turn short; ``text``
    is what was actually said. It is still a completed turn. ``sealed``
    (version 3): ``text`` and ``tool_calls`` encrypted. ``kind`` (version 4):
    what the turn was (:class:`TurnKind`; None: spoken), metadata kept in clear
    and stored in the turn's ``attributes``. ``out_of_context`` (version 4): the
    turn is part of the transcript (it was said) but the framework kept it out of
    the LLM's context (e.g. LiveKit's ``say(..., add_to_chat_ctx=False)``); a
    context rebuilt from the stored turns leaves it out. Kept in clear, in
    ``attributes``, like ``kind``; False (the default, never written): in the context.
    """

    turn_index: Int32
    speaker: Name
    text: Text
    started_at: UtcTime
    ended_at: UtcTime
    input_tokens: Int64 = 0
    output_tokens: Int64 = 0
    tool_calls: list[ToolCall] | None = None
    barged_in: bool = False
    sealed: Sealed | None = None
    kind: WrittenKind | None = None
    out_of_context: bool = False

    added_in: ClassVar[Mapping[str, int]] = {"barged_in": 2, "sealed": 3, "kind": 4, "out_of_context": 4}
    stored_attributes: ClassVar[tuple[str, ...]] = ("kind", "out_of_context")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ended_at < self.started_at:
            raise ValueError("ended_at is before started_at")
        if self.sealed is not None and (self.text or self.tool_calls is not None):
            raise ValueError("a sealed event carries its text and tool calls in sealed only")


class SessionEnded(_Envelope, frozen=True, kw_only=True, tag="session.ended"):
    """Last event of a session; ``last_turn_index`` is None for a session without turns."""

    ended_at: UtcTime
    reason: Name
    last_turn_index: Int32 | None = None


Event = SessionStarted | TurnPartial | TurnCompleted | SessionEnded
EVENT_TYPES: Final = (SessionStarted, TurnPartial, TurnCompleted, SessionEnded)


def turn_attributes(event: TurnPartial | TurnCompleted) -> dict[str, Any] | None:
    """``{name: value}`` of the event's ``stored_attributes`` that it uses (truthy), as JSON
    values (msgspec's builtins); None when it uses none. What the store keeps in the turn's
    ``attributes`` and what the audit fold compares."""
    used = {name: getattr(event, name) for name in event.stored_attributes if getattr(event, name)}
    return msgspec.to_builtins(used) if used else None

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)

#: The event types whose content can be sealed, and their content fields.
CONTENT_FIELDS: Final[Mapping[type, tuple[str, ...]]] = {
    SessionStarted: ("metadata",),
    TurnPartial: ("text",),
    TurnCompleted: ("text", "tool_calls"),
}
_EMPTY: Final[Mapping[str, Any]] = {"metadata": {}, "text": "", "tool_calls": None}


class _Content(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The content fields of any sealable event, as sealed (compact JSON); absent ones are empty."""

    text: Text = ""
    tool_calls: list[ToolCall] | None = None
    metadata: Metadata = {}


_content_decoder = msgspec.json.Decoder(_Content)


def content_of(event: Event) -> bytes:
    """The content fields of ``event`` as a compact JSON object: what a writer seals.

    Raises:
        TypeError: ``event`` carries no content (``SessionEnded``) or is already sealed.
    """
    names = CONTENT_FIELDS.get(type(event))
    if names is None or getattr(event, "sealed", None) is not None:
        raise TypeError(f"{type(event).__name__} has no content to seal")
    return _encoder.encode(_Content(**{name: getattr(event, name) for name in names}))


def without_content(event: Event, sealed: Sealed) -> Event:
    """``event`` with its content fields empty and ``sealed`` set (the writer's last step).

    Raises:
        TypeError: as :func:`content_of`.
    """
    names = CONTENT_FIELDS.get(type(event))
    if names is None:
        raise TypeError(f"{type(event).__name__} has no content to seal")
    return msgspec.structs.replace(
        event, schema_version=msgspec.UNSET, sealed=sealed, **{name: _EMPTY[name] for name in names}
    )


def with_content(event: Event, content: bytes) -> Event:
    """A sealed ``event`` with the opened ``content`` put back, ``sealed`` gone: the
    event its writer built. The content is checked as :func:`decode_event` checks a
    plain event (its nesting first, then the fields' ranges and bounds).

    Raises:
        EventValidationError: the content is not valid for this event type (a field
            another type carries, out of range, nested too deep, over a bound).
        TypeError: ``event`` is not sealed.
    """
    names = CONTENT_FIELDS.get(type(event))
    if names is None or getattr(event, "sealed", None) is None:
        raise TypeError(f"{type(event).__name__} is not sealed")
    try:
        if nesting_exceeds(content, MAX_EVENT_DEPTH):
            raise EventValidationError(f"the sealed content nests deeper than {MAX_EVENT_DEPTH} levels")
        opened = _content_decoder.decode(content)
        extra = [name for name in _EMPTY if name not in names and getattr(opened, name) != _EMPTY[name]]
        if extra:
            raise EventValidationError(f"the sealed content of a {event.__struct_config__.tag} holds {extra[0]}")
        fields = {name: getattr(opened, name) for name in names}
        # Back to the version its writer would have given the plain event.
        plain = msgspec.structs.replace(event, schema_version=msgspec.UNSET, sealed=None, **fields)
    except EventValidationError:
        raise
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise EventValidationError(f"sealed content: {e}") from e
    except ValueError as e:  # a struct's own check (bounds of free-form values)
        raise EventValidationError(f"sealed content: {e}") from e
    except Exception as e:
        raise EventValidationError(f"sealed content cannot be decoded ({type(e).__name__})") from e
    return plain

def _check_free_form(field: str, value: object, max_bytes: int) -> None:
    """The bounds of a free-form value (module docstring, "Bounds on free-form values"),
    both measured on its compact JSON encoding: its nesting with :func:`nesting_exceeds`,
    its size in bytes.

    Decoding, the encoding cannot recurse deeper than the raw scan let through
    (``MAX_EVENT_DEPTH``). Constructing, a value too deep for msgspec's recursive
    encoder (or a cyclic one) raises ``RecursionError`` there, which is that value
    being nested too deep.

    Raises:
        ValueError: nested deeper than ``MAX_VALUE_DEPTH``, or more than ``max_bytes``
            encoded; the message names the field and the limit, never the content.
        TypeError: (constructing only) a value msgspec cannot encode.
    """
    try:
        encoded = _encoder.encode(value)
    except RecursionError:
        raise ValueError(f"{field} is nested deeper than {MAX_VALUE_DEPTH} levels") from None
    if nesting_exceeds(encoded, MAX_VALUE_DEPTH):
        raise ValueError(f"{field} is nested deeper than {MAX_VALUE_DEPTH} levels")
    if len(encoded) > max_bytes:
        raise ValueError(f"{field} is {len(encoded)} bytes encoded; the limit is {max_bytes} bytes")


# The raw nesting scan (nesting_exceeds). A backslash escapes the byte after it (inside a
# string; outside one JSON has none, and msgspec refuses the record there). The quote and
# the backslash are ASCII: they never occur inside a UTF-8 multi-byte sequence.
_ESCAPED = re.compile(rb"\\.", re.DOTALL)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_AS_PARENS = bytes.maketrans(b"[{]}", b"(())")
_SCAN_CHUNK = 32


def nesting_exceeds(data: bytes, limit: int) -> bool:
    """Whether the JSON text ``data`` nests more than ``limit`` objects/arrays deep
    at any point (brackets inside strings do not count).

    A linear scan that does not recurse, so its answer does not depend on the
    caller's stack. On text that is not JSON it answers for the longest valid
    prefix, which is all a decoder reads before refusing it. Costs two
    ``bytes.count`` calls when ``data`` holds at most ``limit`` opening brackets
    (nearly every event).
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    if b"\\" in data:
        data = _ESCAPED.sub(b"", data)  # an escaped quote neither opens nor closes a string
    # Keep quotes and brackets only. The quotes then pair up in order (open, close), so
    # two adjacent ones enclose nothing that counts, whichever pair they are; what is left
    # between an odd quote and the next even one is inside a string.
    marks = data.translate(_AS_PARENS, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in marks:
        marks = b"".join(marks.split(b'"')[::2])
    depth = 0
    for start in range(0, len(marks), _SCAN_CHUNK):
        chunk = marks[start : start + _SCAN_CHUNK]
        opens = chunk.count(b"(")
        if depth + opens <= limit:  # cannot pass the limit inside this chunk
            depth += 2 * opens - len(chunk)
            continue
        for mark in chunk:
            if mark == 0x28:  # "("
                depth += 1
                if depth > limit:
                    return True
            else:
                depth -= 1
    return False


def encode_event(event: Event) -> bytes:
    """Serialize one event to compact JSON bytes (UTF-8)."""
    return _encoder.encode(event)


def decode_event(data: bytes | bytearray | memoryview | str | None) -> Event:
    """Parse and validate one event (a record's value: UTF-8 JSON).

    Every reader refuses the same records whatever its stack depth: the raw
    JSON's nesting is measured without recursion first (:func:`nesting_exceeds`,
    :data:`MAX_EVENT_DEPTH`), then msgspec decodes it.

    Raises:
        EventValidationError: for any failure to decode one record, and nothing
            else: no value (a tombstone), not UTF-8 JSON, nested deeper than
            ``MAX_EVENT_DEPTH``, not an event of a known version (``SCHEMA_VERSIONS``), a
            ``schema_version`` too low for the fields used, a field out of range,
            or a free-form value over its bounds (``MAX_VALUE_DEPTH``,
            ``MAX_METADATA_BYTES``, ``MAX_TOOL_VALUE_BYTES``). ``reason`` names the
            field (msgspec's path, e.g. ``$.seq``) or the limit.
    """
    try:
        if data is None:
            raise EventValidationError("the record has no value")
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        if nesting_exceeds(raw, MAX_EVENT_DEPTH):
            raise EventValidationError(
                f"the event's JSON nests deeper than {MAX_EVENT_DEPTH} levels (metadata, tool arguments and "
                f"results may nest {MAX_VALUE_DEPTH})"
            )
        return _decoder.decode(raw)
    except EventValidationError:
        raise
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise EventValidationError(str(e)) from e
    except Exception as e:  # anything else one record can cause: still that record's fault, never the reader's
        raise EventValidationError(f"cannot be decoded ({type(e).__name__})") from e
