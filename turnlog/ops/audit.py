"""Independent recomputation of a session from its event log (``session_events``).

This is deliberately separate from the sink's SQL path: it folds the stored
events in seq order with plain Python, so comparing its figures with the
finalizer's (computed in SQL from ``transcript_turns``) checks one against the
other. Used by the demo's verdict, by tests and by operators.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from turnlog.schemas import (
    SessionEnded,
    SessionStarted,
    TurnCompleted,
    TurnPartial,
    TurnStatus,
    decode_event,
    turn_attributes,
)

__all__ = ["FoldedTurn", "FoldedSession", "fold_events"]


@dataclass(slots=True)
class FoldedTurn:
    turn_index: int
    speaker: str
    text: str
    status: str  # a TurnStatus: partial | complete | interrupted
    input_tokens: int
    output_tokens: int
    epoch: int
    seq: int
    barged_in: bool = False  # complete, but cut short by the other speaker
    attributes: dict[str, Any] | None = None  # turnlog.schemas.turn_attributes of the turn's last event


@dataclass(slots=True)
class FoldedSession:
    """A session as its events say it is. ``duration_seconds`` is rounded to milliseconds."""

    session_id: str | None = None
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    end_seq: int | None = None
    seqs: list[int] = field(default_factory=list)
    turns: dict[int, FoldedTurn] = field(default_factory=dict)

    @property
    def ordered_turns(self) -> list[FoldedTurn]:
        return [self.turns[i] for i in sorted(self.turns)]

    @property
    def turn_count(self) -> int:
        return len(self.turns)

    @property
    def interrupted_turn_count(self) -> int:
        return sum(1 for t in self.turns.values() if t.status == TurnStatus.INTERRUPTED)

    @property
    def input_tokens(self) -> int:
        return sum(t.input_tokens for t in self.turns.values())

    @property
    def output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.turns.values())

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        micros = (self.ended_at - self.started_at) // dt.timedelta(microseconds=1)
        seconds = Decimal(micros) / 1_000_000
        return float(seconds.quantize(Decimal("0.001"), rounding=ROUND_HALF_UP))  # half away from zero


def fold_events(payloads: Iterable[str | bytes]) -> FoldedSession:
    """Fold one session's stored event payloads (any order) into its turns and figures."""
    events = sorted((decode_event(p) for p in payloads), key=lambda e: (e.seq, e.epoch))
    folded = FoldedSession()
    newest_epoch = 0
    for event in events:
        folded.session_id = event.session_id
        folded.seqs.append(event.seq)
        if event.epoch > newest_epoch:
            newest_epoch = event.epoch
            for turn in folded.turns.values():
                if turn.status == TurnStatus.PARTIAL and turn.epoch < newest_epoch:
                    turn.status = TurnStatus.INTERRUPTED
        if isinstance(event, SessionStarted):
            folded.started_at = folded.started_at or event.started_at
        elif isinstance(event, SessionEnded):
            folded.ended_at, folded.end_seq = event.ended_at, event.seq
            for turn in folded.turns.values():
                if turn.status == TurnStatus.PARTIAL:
                    turn.status = TurnStatus.INTERRUPTED
        elif isinstance(event, (TurnPartial, TurnCompleted)):
            complete = isinstance(event, TurnCompleted)
            current = folded.turns.get(event.turn_index)
            if current is not None:
                if (event.epoch, event.seq) <= (current.epoch, current.seq):
                    continue
                if current.status == TurnStatus.COMPLETE and not complete:
                    continue
            folded.turns[event.turn_index] = FoldedTurn(
                turn_index=event.turn_index,
                speaker=event.speaker,
                text=event.text,
                status=TurnStatus.COMPLETE if complete else TurnStatus.PARTIAL,
                input_tokens=event.input_tokens if isinstance(event, TurnCompleted) else 0,
                output_tokens=event.output_tokens if isinstance(event, TurnCompleted) else 0,
                epoch=event.epoch,
                seq=event.seq,
                barged_in=isinstance(event, TurnCompleted) and event.barged_in,
                attributes=turn_attributes(event),
            )
    return folded
