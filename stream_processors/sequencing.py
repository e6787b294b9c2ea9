"""The sequencer's per-session state machine (pure logic, no I/O).

For each event of a session, in partition order, :func:`sequence` decides what
to emit to the ordered transcript and what to reject to the DLQ:

- ``seq`` below the next expected one: a duplicate (app-level re-send), dropped;
- ``seq`` above it: buffered (bounded) until the gap fills, in seq order;
- ``epoch`` below the newest seen: a zombie's event, fenced (DLQ);
- ``epoch`` above it: a new owner (resume); the older epoch's buffered events
  are fenced, and if the new owner starts at a seq an older epoch already used
  (a zombie wrote after the resume barrier), the new owner wins from there;
- anything after ``session.ended`` (a re-send, or a reused session id): DLQ.

Crash safety lives in the caller (``sequencer.py``): the new state is stored
only after everything it emitted is acknowledged, so after a crash the state is
never ahead of the transcript. Re-processing from the committed offset with an
older state re-emits the same events in the same order (duplicates, which the
sink drops by seq); with a newer state the records are duplicates here.

Gap repair: one producer's events reach a partition in seq order, so a missing
seq, if it was ever written, sits between the offset of the last applied event
(``applied_offset``) and the offset of the first buffered one.
:meth:`SessionSequence.missing_range` names that range, and the caller re-reads
it from the log (a consumer that dropped a record is thereby healed).

Bounded in bytes: a buffered event is kept as its position in the events log
(:class:`Buffered`: seq, epoch, offset, size), never as its bytes, so a
session's state (one changelog record) stays a few bytes per buffered event
whatever the events' sizes. The bytes are in memory only during the batch that
buffered the event; once the state went through its JSON form, the caller reads
a released or rejected buffered event again from the log at its offset. The
reorder buffer holds at most ``max_buffer`` events and ``max_buffer_bytes``
bytes of events (their sizes in the log); an event beyond either goes to the
DLQ (``overflow:``), like any event the gap outlives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turnlog.schemas import Event, SessionEnded, SessionStarted

__all__ = ["SessionSequence", "Buffered", "Decision", "sequence", "raw_of", "DEFAULT_MAX_BUFFER_BYTES"]

#: Bytes of events (their sizes in the log) one session's reorder buffer holds by default.
DEFAULT_MAX_BUFFER_BYTES = 16 * 1024 * 1024


@dataclass(slots=True)
class Buffered:
    """An event waiting for a missing seq: where it is in the events log (``offset``, of
    ``size`` bytes), and its bytes (``raw``) while the batch that buffered it runs.

    ``raw`` is None in a state read from its JSON form (the changelog): the event is then
    read again from the log at ``offset`` (``Sequencer``), or taken as lost if it is gone.
    """

    seq: int
    epoch: int
    ends_session: bool
    offset: int
    size: int
    raw: bytes | None = field(default=None, compare=False)


def raw_of(item: bytes | Buffered) -> bytes:
    """The bytes of an emitted or rejected event (:attr:`Decision.emit`, :attr:`Decision.dlq`).

    Raises:
        LookupError: ``item`` is a buffered event whose bytes are not in memory (its
            state came from JSON): read it from the log at ``item.offset``.
    """
    if isinstance(item, Buffered):
        if item.raw is None:
            raise LookupError(f"buffered seq {item.seq} at offset {item.offset} is not in memory")
        return item.raw
    return item


@dataclass(slots=True)
class SessionSequence:
    """Sequencer state of one session (one Faust table entry)."""

    epoch: int = 0
    next_seq: int = 0
    ended: bool = False
    #: source offset of the event that carried seq ``next_seq - 1`` (-1: none yet)
    applied_offset: int = -1
    #: event_id of the session.started that opened the session (tells a re-send from a reused id)
    started_event_id: str | None = None
    reused: bool = False
    #: seq -> the buffered event waiting for ``next_seq``
    buffer: dict[int, Buffered] = field(default_factory=dict)
    #: the fleet that owns the session: the signer of its first admitted record (None: not yet, or open mode)
    fleet: str | None = None

    def missing_range(self) -> tuple[int, int] | None:
        """``(first, last)`` source offsets (inclusive) where the missing seq must be, if there is a gap."""
        if not self.buffer:
            return None
        return self.applied_offset + 1, min(b.offset for b in self.buffer.values()) - 1

    def buffered_bytes(self) -> int:
        """Bytes (sizes in the log) of the buffered events."""
        return sum(b.size for b in self.buffer.values())

    def to_json(self) -> dict[str, Any]:
        """The JSON form (the changelog record's value): a few bytes per buffered event, never
        its bytes (``"buffered"``: ``{seq: [epoch, ends_session, offset, size]}``).
        ``"buffer"`` (the raw form, read by sequencers before positions) is always empty:
        such a sequencer finds the buffered events again through its gap re-read."""
        return {
            "epoch": self.epoch,
            "next_seq": self.next_seq,
            "ended": self.ended,
            "applied_offset": self.applied_offset,
            "started_event_id": self.started_event_id,
            "reused": self.reused,
            "fleet": self.fleet,
            "buffered": {str(seq): [b.epoch, b.ends_session, b.offset, b.size] for seq, b in self.buffer.items()},
            "buffer": {},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> SessionSequence:
        """The state of a :meth:`to_json` form, or of an older one (missing keys take their
        defaults, unknown keys are ignored). A buffered event of the older raw form
        (``"buffer"``: ``{seq: [epoch, ends_session, offset, text]}``) keeps its bytes in memory.
        """
        if not data:
            return cls()
        buffer = {
            int(seq): Buffered(int(seq), epoch, ends, offset, size)
            for seq, (epoch, ends, offset, size) in data.get("buffered", {}).items()
        }
        for seq, (epoch, ends, offset, text) in data.get("buffer", {}).items():
            raw = text.encode("utf-8")
            buffer[int(seq)] = Buffered(int(seq), epoch, ends, offset, len(raw), raw)
        return cls(
            epoch=data.get("epoch", 0),
            next_seq=data.get("next_seq", 0),
            ended=data.get("ended", False),
            applied_offset=data.get("applied_offset", -1),
            started_event_id=data.get("started_event_id"),
            reused=data.get("reused", False),
            fleet=data.get("fleet"),
            buffer=buffer,
        )


@dataclass(slots=True)
class Decision:
    """What to do with one incoming event."""

    #: to the transcript, in order: the event's own bytes, or a buffered event released behind it
    emit: list[bytes | Buffered] = field(default_factory=list)
    #: to the DLQ, each with its reason (:func:`raw_of` gives the bytes of either kind)
    dlq: list[tuple[bytes | Buffered, str]] = field(default_factory=list)
    duplicate: bool = False
    gap_opened: bool = False


def sequence(
    state: SessionSequence,
    event: Event,
    raw: bytes,
    offset: int,
    *,
    max_buffer: int,
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
) -> Decision:
    """Apply one event (``raw``: its exact bytes; ``offset``: its source offset) to ``state``.

    Mutates ``state``; returns the events to emit, in order, and the rejects. The reorder
    buffer holds at most ``max_buffer`` events and ``max_buffer_bytes`` bytes of them.
    """
    decision = Decision()
    if event.epoch < state.epoch:
        decision.dlq.append((raw, f"fenced: epoch {event.epoch} is older than the session's epoch {state.epoch}"))
        return decision
    if state.ended:
        if isinstance(event, SessionStarted) and str(event.event_id) != state.started_event_id:
            state.reused = True  # not a re-send of this session's start: the id is being used again
        if state.reused:
            decision.dlq.append((raw, f"after session.ended: session id reused (seq {event.seq}, epoch {event.epoch})"))
        elif event.seq < state.next_seq:
            decision.duplicate = True  # a re-send, or a redelivery after a restart
        else:
            decision.dlq.append((raw, f"after session.ended: seq {event.seq} arrived after the session ended"))
        return decision
    if event.epoch > state.epoch:
        for seq, held in sorted(state.buffer.items()):
            decision.dlq.append(
                (held, f"fenced: buffered seq {seq} of epoch {held.epoch} superseded by epoch {event.epoch}")
            )
        state.buffer.clear()
        state.epoch = event.epoch
        if event.seq < state.next_seq:
            state.next_seq = event.seq  # the new owner wins the seqs a zombie took

    if event.seq < state.next_seq or event.seq in state.buffer:
        decision.duplicate = True
        return decision
    if event.seq > state.next_seq:
        held_bytes = state.buffered_bytes()
        if len(state.buffer) >= max_buffer:
            decision.dlq.append(
                (raw, f"overflow: reorder buffer full ({max_buffer} events) while waiting for seq {state.next_seq}")
            )
        elif held_bytes + len(raw) > max_buffer_bytes:
            decision.dlq.append((raw, (
                f"overflow: reorder buffer full ({held_bytes} bytes held, {len(raw)} more would pass"
                f" {max_buffer_bytes}) while waiting for seq {state.next_seq}"
            )))
        else:
            decision.gap_opened = not state.buffer
            state.buffer[event.seq] = Buffered(
                event.seq, event.epoch, isinstance(event, SessionEnded), offset, len(raw), raw
            )
        return decision

    decision.emit.append(raw)
    if isinstance(event, SessionStarted) and state.started_event_id is None:
        state.started_event_id = str(event.event_id)
    state.next_seq += 1
    state.applied_offset = offset
    state.ended = isinstance(event, SessionEnded)
    while not state.ended and state.next_seq in state.buffer:
        held = state.buffer.pop(state.next_seq)
        decision.emit.append(held)
        state.next_seq += 1
        state.applied_offset = held.offset
        state.ended = held.ends_session
    if state.ended:
        for seq, held in sorted(state.buffer.items()):
            decision.dlq.append((held, f"after session.ended: seq {seq} arrived after the session ended"))
        state.buffer.clear()
    return decision
