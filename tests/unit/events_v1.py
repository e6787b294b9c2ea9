# The event model as released in version 1 (schemas/events.py at commit c151c3f),
# copied verbatim and never edited: the old reader and the old writer of the
# rolling-upgrade tests (tests/unit/test_schemas.py).
"""Event model, version 1 (see docs/design.md, "Events").

Every event carries the envelope ``schema_version``, ``event_id``, ``type``,
``session_id``, ``seq``, ``epoch``, ``producer_id`` and ``emitted_at`` (UTC).
``seq`` is the per-session order key, strictly increasing from 0; ``epoch``
grows by one each time a new process resumes the session (fencing).

Events travel as JSON; :func:`decode_event` validates bytes against this model
(the checked-in JSON Schema files in ``schemas/json/`` are generated from it by
``python -m turnlog.schemas.generate``).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Final, Literal, Union

import msgspec

from turnlog.schemas.exceptions import EventValidationError

__all__ = [
    "SCHEMA_VERSION",
    "MAX_TEXT_CHARS",
    "Event",
    "SessionStarted",
    "TurnPartial",
    "TurnCompleted",
    "SessionEnded",
    "ToolCall",
    "encode_event",
    "decode_event",
    "EVENT_TYPES",
]

SCHEMA_VERSION: Final = 1
#: Hard limit of the schema on a turn's text, in characters. The producer's own
#: (configurable, lower) limit is in bytes: ``TurnlogSettings.max_text_bytes``.
MAX_TEXT_CHARS: Final = 262_144

SessionId = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$",
        description="Opaque session id; the Kafka key of every event of the session.",
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


#: Timestamps must fall in these years, so any UTC offset converts without overflow.
EARLIEST_YEAR, LATEST_YEAR = 1900, 9000


class _Envelope(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="type"):
    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: uuid.UUID
    session_id: SessionId
    seq: Int64
    epoch: Int32
    producer_id: Name
    emitted_at: UtcTime

    def __post_init__(self) -> None:
        # Python's "$" also matches before a final newline; JSON Schema's does not.
        if self.session_id.endswith("\n"):
            raise ValueError("session_id ends with a newline")
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if isinstance(value, dt.datetime) and not EARLIEST_YEAR <= value.year <= LATEST_YEAR:
                raise ValueError(f"{name} is outside the years {EARLIEST_YEAR}..{LATEST_YEAR}")


class SessionStarted(_Envelope, frozen=True, kw_only=True, tag="session.started"):
    """First event of a session (seq 0)."""

    fleet: Name
    agent_id: Name
    started_at: UtcTime
    metadata: dict[str, Any] = {}


class TurnPartial(_Envelope, frozen=True, kw_only=True, tag="turn.partial"):
    """The whole text of an unfinished turn so far (not a delta)."""

    turn_index: Int32
    speaker: Name
    text: Text
    started_at: UtcTime


class ToolCall(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Name
    arguments: dict[str, Any] = {}
    result: Any = None


class TurnCompleted(_Envelope, frozen=True, kw_only=True, tag="turn.completed"):
    """A finished turn; ``input_tokens``/``output_tokens`` are counts, not bytes."""

    turn_index: Int32
    speaker: Name
    text: Text
    started_at: UtcTime
    ended_at: UtcTime
    input_tokens: Int64 = 0
    output_tokens: Int64 = 0
    tool_calls: list[ToolCall] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ended_at < self.started_at:
            raise ValueError("ended_at is before started_at")


class SessionEnded(_Envelope, frozen=True, kw_only=True, tag="session.ended"):
    """Last event of a session; ``last_turn_index`` is None for a session without turns."""

    ended_at: UtcTime
    reason: Name
    last_turn_index: Int32 | None = None


Event = Union[SessionStarted, TurnPartial, TurnCompleted, SessionEnded]
EVENT_TYPES: Final = (SessionStarted, TurnPartial, TurnCompleted, SessionEnded)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)


def encode_event(event: Event) -> bytes:
    """Serialize one event to compact JSON bytes (UTF-8)."""
    return _encoder.encode(event)


def decode_event(data: bytes | bytearray | memoryview | str) -> Event:
    """Parse and validate one event.

    Raises:
        EventValidationError: not JSON, not a v1 event, or a field out of range;
            ``reason`` names the field (msgspec's path, e.g. ``$.seq``).
    """
    try:
        return _decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise EventValidationError(str(e)) from e
