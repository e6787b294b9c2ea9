"""Event model (version 2; reads version 1): structs, JSON encoding, validation and the JSON Schema files."""

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
    TurnPartial,
    decode_event,
    encode_event,
)
from turnlog.schemas.exceptions import EventValidationError, SchemaError

__all__ = [
    "EVENT_TYPES",
    "MAX_TEXT_CHARS",
    "SCHEMA_VERSION",
    "SCHEMA_VERSIONS",
    "Event",
    "EventValidationError",
    "SchemaError",
    "SessionEnded",
    "SessionStarted",
    "ToolCall",
    "TurnCompleted",
    "TurnPartial",
    "decode_event",
    "encode_event",
]
