"""What one sequencer batch sends, in order, collected before any of it is sent.

The sequencer decides a whole batch first (``sequencer.py``) and sends after:
a buffered event released or rejected in the batch may be known only by its
position in the events log (``sequencing.Buffered`` without its bytes), and
its bytes are read again from the log before anything is sent. Each
:class:`Outgoing` is one record for the transcript or the DLQ, with what the
sequencer needs to turn it into a DLQ reference (a record whose bytes are left
out, with the reason) if it cannot be sent as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from turnlog.schemas.headers import EventType
from turnlog.stream_processors.sequencing import Buffered
from turnlog.tracing import TraceSpan

__all__ = ["Outgoing", "Outbox"]


@dataclass(slots=True)
class Outgoing:
    """One record to send: to the transcript (``reason`` None) or to the DLQ.

    ``value``: the event's bytes, or a buffered event (its bytes in ``raw``, or None
    until read again from the log), or None (a rejected record that had no value).
    ``source_offset``: the events-topic offset the record came from (the DLQ names it;
    a buffered event's own offset).
    """

    topic: str
    key: bytes | None
    value: bytes | Buffered | None
    partition: int
    source_offset: int
    #: the transcript: the event's type when known (None: peeked from its bytes when sent)
    kind: EventType | None = None
    #: the DLQ: why the record is rejected
    reason: str | None = None
    #: a DLQ reference: it stands for a record that could not be sent (its value is empty)
    reference: bool = False
    #: the transcript: the trace headers (``traceparent``) of the sequencer's span of this event, if traced
    trace: tuple[tuple[str, bytes], ...] = ()

    def unread(self) -> Buffered | None:
        """The buffered event whose bytes must be read again from the log, if any."""
        value = self.value
        return value if isinstance(value, Buffered) and value.raw is None else None


@dataclass(slots=True)
class Outbox:
    """A batch's records in the order they are to be sent (the transcript's order per session).

    Has the ``transcript``/``dlq`` pair where the sequencer's decisions land; :attr:`items`
    is what is sent, each once, in this order.
    """

    items: list[Outgoing] = field(default_factory=list)
    #: the spans of the batch's traced records, ended once the batch is delivered (or failed)
    spans: list[TraceSpan] = field(default_factory=list)

    def transcript(
        self, topic: str, *, key: bytes, value: bytes | Buffered, partition: int, source_offset: int,
        kind: EventType | None, trace: tuple[tuple[str, bytes], ...] = (),
    ) -> None:
        self.items.append(Outgoing(topic, key, value, partition, source_offset, kind=kind, trace=trace))

    def dlq(
        self, topic: str, *, key: bytes | None, value: bytes | Buffered | None, partition: int, source_offset: int,
        reason: str,
    ) -> None:
        self.items.append(Outgoing(topic, key, value, partition, source_offset, reason=reason))

    def unread(self) -> Iterator[tuple[Outgoing, Buffered]]:
        """Each record whose buffered event's bytes are not in memory, with that event."""
        for item in self.items:
            held = item.unread()
            if held is not None:
                yield item, held
