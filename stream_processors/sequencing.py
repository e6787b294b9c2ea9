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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turnlog.schemas import Event, SessionEnded, SessionStarted

__all__ = ["SessionSequence", "Buffered", "Decision", "sequence"]


@dataclass(slots=True)
class Buffered:
    """An event waiting for a missing seq."""

    epoch: int
    ends_session: bool
    offset: int
    raw: bytes


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
    buffer: dict[int, Buffered] = field(default_factory=dict)
    #: the fleet that owns the session: the signer of its first admitted record (None: not yet, or open mode)
    fleet: str | None = None

    def missing_range(self) -> tuple[int, int] | None:
        """``(first, last)`` source offsets (inclusive) where the missing seq must be, if there is a gap."""
        if not self.buffer:
            return None
        return self.applied_offset + 1, min(b.offset for b in self.buffer.values()) - 1

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "next_seq": self.next_seq,
            "ended": self.ended,
            "applied_offset": self.applied_offset,
            "started_event_id": self.started_event_id,
            "reused": self.reused,
            "fleet": self.fleet,
            "buffer": {
                str(seq): [b.epoch, b.ends_session, b.offset, b.raw.decode("utf-8")] for seq, b in self.buffer.items()
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> SessionSequence:
        if not data:
            return cls()
        return cls(
            epoch=data["epoch"],
            next_seq=data["next_seq"],
            ended=data["ended"],
            applied_offset=data.get("applied_offset", -1),
            started_event_id=data.get("started_event_id"),
            reused=data.get("reused", False),
            fleet=data.get("fleet"),
            buffer={
                int(seq): Buffered(epoch, ends, offset, raw.encode("utf-8"))
                for seq, (epoch, ends, offset, raw) in data["buffer"].items()
            },
        )


@dataclass(slots=True)
class Decision:
    """What to do with one incoming event."""

    emit: list[bytes] = field(default_factory=list)
    dlq: list[tuple[bytes, str]] = field(default_factory=list)
    duplicate: bool = False
    gap_opened: bool = False


def sequence(state: SessionSequence, event: Event, raw: bytes, offset: int, *, max_buffer: int) -> Decision:
    """Apply one event (``raw``: its exact bytes; ``offset``: its source offset) to ``state``.

    Mutates ``state``; returns the events to emit, in order, and the rejects.
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
                (held.raw, f"fenced: buffered seq {seq} of epoch {held.epoch} superseded by epoch {event.epoch}")
            )
        state.buffer.clear()
        state.epoch = event.epoch
        if event.seq < state.next_seq:
            state.next_seq = event.seq  # the new owner wins the seqs a zombie took

    if event.seq < state.next_seq or event.seq in state.buffer:
        decision.duplicate = True
        return decision
    if event.seq > state.next_seq:
        if len(state.buffer) >= max_buffer:
            decision.dlq.append(
                (raw, f"reorder buffer full ({max_buffer} events) while waiting for seq {state.next_seq}")
            )
        else:
            decision.gap_opened = not state.buffer
            state.buffer[event.seq] = Buffered(event.epoch, isinstance(event, SessionEnded), offset, raw)
        return decision

    decision.emit.append(raw)
    if isinstance(event, SessionStarted) and state.started_event_id is None:
        state.started_event_id = str(event.event_id)
    state.next_seq += 1
    state.applied_offset = offset
    state.ended = isinstance(event, SessionEnded)
    while not state.ended and state.next_seq in state.buffer:
        held = state.buffer.pop(state.next_seq)
        decision.emit.append(held.raw)
        state.next_seq += 1
        state.applied_offset = held.offset
        state.ended = held.ends_session
    if state.ended:
        for seq, held in sorted(state.buffer.items()):
            decision.dlq.append((held.raw, f"after session.ended: seq {seq} arrived after the session ended"))
        state.buffer.clear()
    return decision
