"""Typed signals beside an event's bytes: the Kafka record headers turnlog sets.

``turnlog-type`` (:data:`EVENT_TYPE_HEADER`): the type of the event a
``<prefix>.transcript`` record carries, an :class:`EventType` value in ASCII
(``turn.partial``, ``turn.completed``, ``session.started``,
``session.ended``). The sequencer sets it on every record it emits
(``stream_processors/sequencer.py``); the sink reads it to tell a partial
from a record that closes a batch without decoding the value
(``sinks/service.py``).

A record without the header (emitted by a sequencer from before it, or
copied by another tool) is typed from its value: :func:`peek_event_type`
decodes the JSON's ``type`` member by name, wherever it sits in the object,
and skips the rest unvalidated. So nothing depends on the field order of the
encoder. A header that names no known type counts as absent.

The header is a hint for routing and batching only: the value stays the
event, and the store decides from the decoded event, never from the header.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Final

import msgspec

from turnlog.schemas.events import EVENT_TYPES, MAX_EVENT_DEPTH, Event, nesting_exceeds

__all__ = [
    "EVENT_TYPE_HEADER",
    "EventType",
    "Headers",
    "event_type",
    "header_event_type",
    "peek_event_type",
    "record_event_type",
    "type_headers",
]

#: The header naming the event type of a transcript record.
EVENT_TYPE_HEADER: Final = "turnlog-type"

#: Kafka record headers in confluent-kafka's shapes (``Message.headers()`` gives the list; None when there are none).
Headers = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None


class EventType(StrEnum):
    """The event types: each value is the ``type`` tag of one event struct (``schemas/events.py``)."""

    SESSION_STARTED = "session.started"
    TURN_PARTIAL = "turn.partial"
    TURN_COMPLETED = "turn.completed"
    SESSION_ENDED = "session.ended"


#: Each event struct's type (a tag missing from EventType fails here, at import).
_TYPE_OF: Final[dict[type, EventType]] = {cls: EventType(str(cls.__struct_config__.tag)) for cls in EVENT_TYPES}


def event_type(event: Event) -> EventType:
    """The type of a decoded event."""
    return _TYPE_OF[type(event)]


class _Tagged(msgspec.Struct):
    """Only the ``type`` member of an event; every other member is skipped."""

    type: EventType


_tag_decoder = msgspec.json.Decoder(_Tagged)


def peek_event_type(value: bytes | None) -> EventType | None:
    """The ``type`` member of an event's JSON, or None if ``value`` is not a JSON
    object with a known type. The rest of the event is not validated, but a value
    nested deeper than an event may be (``MAX_EVENT_DEPTH``) is None here too,
    checked before msgspec skips through it (recursively); nothing else is raised."""
    if value is None:
        return None
    try:
        if nesting_exceeds(value, MAX_EVENT_DEPTH):
            return None
        return _tag_decoder.decode(value).type
    except Exception:  # whatever one record's bytes cause: no type, as for any undecodable value
        return None


def type_headers(kind: EventType | None) -> list[tuple[str, bytes]] | None:
    """The headers of a transcript record whose event is of type ``kind`` (None: no headers)."""
    if kind is None:
        return None
    return [(EVENT_TYPE_HEADER, kind.value.encode("ascii"))]


_BY_HEADER_VALUE: Final[dict[str | bytes, EventType]] = {
    **{kind.value.encode("ascii"): kind for kind in EventType},
    **{kind.value: kind for kind in EventType},
}


def header_event_type(headers: Headers) -> EventType | None:
    """The event type the :data:`EVENT_TYPE_HEADER` names, or None if it is
    absent or names no known type."""
    if headers is None:
        return None
    for name, value in headers.items() if isinstance(headers, Mapping) else headers:
        if name == EVENT_TYPE_HEADER:
            return _BY_HEADER_VALUE.get(value) if value is not None else None
    return None


def record_event_type(headers: Headers, value: bytes | None) -> EventType | None:
    """A transcript record's event type: from its header, else from its value
    (older records); None if neither says (an undecodable value)."""
    kind = header_event_type(headers)
    return kind if kind is not None else peek_event_type(value)
