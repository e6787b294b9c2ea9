"""Event model (version 4; reads versions 1 to 3): structs, JSON encoding, validation and the JSON Schema files;
the session and turn statuses of the store; the typed record headers (``turnlog-type``)."""

from turnlog.schemas.events import (
    EVENT_TYPES,
    MAX_TEXT_CHARS,
    SCHEMA_VERSION,
    SCHEMA_VERSIONS,
    Event,
    SessionEnded,
    SessionStarted,
    ToolCall,
    TurnCompleted,
    TurnKind,
    TurnPartial,
    decode_event,
    encode_event,
    turn_attributes,
)
from turnlog.schemas.exceptions import EventValidationError, SchemaError
from turnlog.schemas.headers import EVENT_TYPE_HEADER, EventType
from turnlog.schemas.statuses import SETTLED_SESSION_STATUSES, SessionStatus, TurnStatus

__all__ = [
    "EVENT_TYPE_HEADER",
    "EVENT_TYPES",
    "MAX_TEXT_CHARS",
    "SCHEMA_VERSION",
    "SCHEMA_VERSIONS",
    "SETTLED_SESSION_STATUSES",
    "Event",
    "EventType",
    "EventValidationError",
    "SchemaError",
    "SessionEnded",
    "SessionStarted",
    "SessionStatus",
    "ToolCall",
    "TurnCompleted",
    "TurnKind",
    "TurnPartial",
    "TurnStatus",
    "decode_event",
    "encode_event",
    "turn_attributes",
]
