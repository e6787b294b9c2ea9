"""The sequencer's per-session state machine (pure logic, no I/O).

For each event of a session, in partition order, :func:`sequence` decides what
to emit to the ordered transcript and what to reject to the DLQ:

- ``seq`` below the next expected one: a duplicate (app-level re-send), dropped;
- ``seq`` above it: buffered (bounded) until the gap fills, in seq order;
- ``epoch`` below the newest seen: a zombie's event, fenced (DLQ);
- ``epoch`` above it: a new owner (resume); the older epoch's buffered events
  are fenced, and if the new owner starts at a seq an older epoch already used
  (a zombie wrote after the resume barrier), the new owner wins from there;
- anything after ``session.ended``: DLQ.

Crash safety: the state records the highest source offset applied. A record at
or below it is a re-delivery after a crash (state and changelog may be ahead of
the committed offset, while the emission may have been lost), so it is emitted
again if its epoch owns its seq; the sink deduplicates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turnlog.schemas import Event, SessionEnded

__all__ = ["SessionSequence", "Decision", "sequence"]


@dataclass(slots=True)
class SessionSequence:
    """Sequencer state of one session (one Faust table entry)."""

    epoch: int = 0
    next_seq: int = 0
    last_offset: int = -1
    ended: bool = False
    # (epoch, first seq it owns), ascending: who owns which seqs.
    epoch_starts: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])
    # seq -> (epoch, ends the session?, raw event) waiting for a missing seq.
    buffer: dict[int, tuple[int, bool, bytes]] = field(default_factory=dict)

    def owner_of(self, seq: int) -> int:
        owner = self.epoch_starts[0][0]
        for epoch, first in self.epoch_starts:
            if first <= seq:
                owner = epoch
        return owner

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "next_seq": self.next_seq,
            "last_offset": self.last_offset,
            "ended": self.ended,
            "epoch_starts": [list(p) for p in self.epoch_starts],
            "buffer": {str(seq): [epoch, end, raw.decode("utf-8")] for seq, (epoch, end, raw) in self.buffer.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> SessionSequence:
        if not data:
            return cls()
        return cls(
            epoch=data["epoch"],
            next_seq=data["next_seq"],
            last_offset=data["last_offset"],
            ended=data["ended"],
            epoch_starts=[(e, s) for e, s in data["epoch_starts"]],
            buffer={int(seq): (epoch, end, raw.encode("utf-8")) for seq, (epoch, end, raw) in data["buffer"].items()},
        )


@dataclass(slots=True)
class Decision:
    """What to do with one incoming event."""

    emit: list[bytes] = field(default_factory=list)
    dlq: list[tuple[bytes, str]] = field(default_factory=list)
    duplicate: bool = False
    replayed: bool = False
    gap_opened: bool = False


def sequence(state: SessionSequence, event: Event, raw: bytes, offset: int, *, max_buffer: int) -> Decision:
    """Apply one event (``raw`` is its exact bytes, ``offset`` its source offset) to ``state``.

    Mutates ``state``; returns the events to emit, in order, and the rejects.
    """
    decision = Decision()
    if offset <= state.last_offset:
        decision.replayed = True
        if event.seq < state.next_seq and state.owner_of(event.seq) == event.epoch:
            decision.emit.append(raw)
        return decision
    state.last_offset = offset

    if event.epoch < state.epoch:
        decision.dlq.append((raw, f"fenced: epoch {event.epoch} is older than the session's epoch {state.epoch}"))
        return decision
    if state.ended:
        if event.seq < state.next_seq:
            decision.duplicate = True
        else:
            decision.dlq.append((raw, f"after session.ended: seq {event.seq} follows the end of the session"))
        return decision
    if event.epoch > state.epoch:
        for seq, (epoch, _, held) in sorted(state.buffer.items()):
            decision.dlq.append((held, f"fenced: buffered seq {seq} of epoch {epoch} superseded by epoch {event.epoch}"))
        state.buffer.clear()
        state.epoch = event.epoch
        if event.seq < state.next_seq:
            state.next_seq = event.seq  # the new owner wins the seqs a zombie took
        state.epoch_starts = [(e, s) for e, s in state.epoch_starts if s < event.seq]
        state.epoch_starts.append((event.epoch, event.seq))

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
            state.buffer[event.seq] = (event.epoch, isinstance(event, SessionEnded), raw)
        return decision

    decision.emit.append(raw)
    state.next_seq += 1
    state.ended = isinstance(event, SessionEnded)
    while not state.ended and state.next_seq in state.buffer:
        _, ends, held = state.buffer.pop(state.next_seq)
        decision.emit.append(held)
        state.next_seq += 1
        state.ended = ends
    if state.ended:
        for seq, (_, _, held) in sorted(state.buffer.items()):
            decision.dlq.append((held, f"after session.ended: seq {seq} follows the end of the session"))
        state.buffer.clear()
    return decision

