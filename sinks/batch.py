"""Pure planning of one sink batch: which rows to write, and which update wins.

No I/O here: :func:`plan_batch` turns consumed messages into rows; the store
(``sinks/transcript.py``) writes the plan in one transaction. The rules are the ones
of docs/design.md ("Guarantees"): dedupe by ``(session_id, seq)``, a turn is only
overwritten by a newer ``(epoch, seq)``, and a partial never downgrades a
completed turn.

A turn cut short by the other speaker (``TurnCompleted.barged_in``) is a
completed turn like any other: status ``complete``, with the words actually
spoken, and ``barged_in`` set. ``interrupted`` stays what it was: a turn never
completed, because its writer died or its session ended.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from turnlog.crypto.envelope import EventOpener, is_sealed, open_sealed
from turnlog.schemas import (
    Event,
    EventValidationError,
    SessionEnded,
    SessionStarted,
    SessionStatus,
    TurnCompleted,
    TurnPartial,
    TurnStatus,
    decode_event,
    encode_event,
    turn_attributes,
)
from turnlog.sinks.source_records import SourceMessage, next_offsets

__all__ = [
    "TurnRow",
    "SessionChanges",
    "BatchPlan",
    "plan_batch",
    "plan_each",
    "turn_update_wins",
    "advance_contiguous",
    "RejectedMessage",
    "WriteResult",
    "merge_session",
    "ready_to_finalize",
    "TURN_PARTIAL",
    "TURN_COMPLETE",
    "TURN_INTERRUPTED",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

# The turn statuses (``turnlog.schemas.TurnStatus``), by this module's short names.
TURN_PARTIAL = TurnStatus.PARTIAL
TURN_COMPLETE = TurnStatus.COMPLETE
TURN_INTERRUPTED = TurnStatus.INTERRUPTED


@dataclass(frozen=True, slots=True)
class TurnRow:
    """A ``transcript_turns`` row as one event leaves it."""

    session_id: str
    turn_index: int
    speaker: str
    text: str
    status: str
    started_at: dt.datetime
    ended_at: dt.datetime | None
    input_tokens: int
    output_tokens: int
    tool_calls: list[dict[str, Any]] | None
    epoch: int
    seq: int
    #: A complete turn cut short by the other speaker (its status stays ``complete``).
    barged_in: bool = False
    #: The turn's optional attributes (``turnlog.schemas.turn_attributes``), or None.
    attributes: dict[str, Any] | None = None

    @classmethod
    def from_event(cls, event: TurnPartial | TurnCompleted) -> TurnRow:
        if isinstance(event, TurnCompleted):
            return cls(
                session_id=event.session_id,
                turn_index=event.turn_index,
                speaker=event.speaker,
                text=event.text,
                status=TURN_COMPLETE,
                started_at=event.started_at,
                ended_at=event.ended_at,
                input_tokens=event.input_tokens,
                output_tokens=event.output_tokens,
                tool_calls=(
                    [{"name": c.name, "arguments": c.arguments, "result": c.result} for c in event.tool_calls]
                    if event.tool_calls is not None
                    else None
                ),
                epoch=event.epoch,
                seq=event.seq,
                barged_in=event.barged_in,
                attributes=turn_attributes(event),
            )
        return cls(
            session_id=event.session_id,
            turn_index=event.turn_index,
            speaker=event.speaker,
            text=event.text,
            status=TURN_PARTIAL,
            started_at=event.started_at,
            ended_at=None,
            input_tokens=0,
            output_tokens=0,
            tool_calls=None,
            epoch=event.epoch,
            seq=event.seq,
            attributes=turn_attributes(event),
        )

    def as_row(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def turn_update_wins(current_status: str, current_epoch: int, current_seq: int, candidate: TurnRow) -> bool:
    """Whether ``candidate`` may overwrite a stored turn.

    It must be newer by ``(epoch, seq)`` (a stale writer never overwrites), and a
    partial never downgrades a completed turn. The SQL upsert guard in
    ``sinks/transcript.py`` states the same rule; tests hold the two together.
    """
    newer = (candidate.epoch, candidate.seq) > (current_epoch, current_seq)
    downgrade = current_status == TURN_COMPLETE and candidate.status == TURN_PARTIAL
    return newer and not downgrade


@dataclass(slots=True)
class SessionChanges:
    """What one batch says about one session."""

    session_id: str
    started: SessionStarted | None = None
    ended: SessionEnded | None = None
    max_epoch: int = 0
    seqs: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class RejectedMessage:
    """A record a writer refused, and why: ``reason_class`` and ``reason`` make the DLQ's reason
    ``<class>: <reason>`` (turnlog/dlq.py's classes; ``invalid`` unless the writer knows better)."""

    message: SourceMessage
    reason: str
    reason_class: str = "invalid"


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a batch writer did in the caller's transaction (``sinks.interfaces.BatchWriter``).

    ``rejected``: the records it refused, with a reason; ``finalized``: the
    sessions whose guarded finalize matched in this transaction (committed, or
    not, together with the rows and the offsets). For the sink's metrics once the
    transaction commits: ``turns_emitted_at``, the ``emitted_at`` of each
    ``turn.completed`` event written; ``ended_at``, each finalized session's ``ended_at``.
    """

    rejected: list[RejectedMessage] = field(default_factory=list)
    finalized: tuple[str, ...] = ()
    turns_emitted_at: tuple[dt.datetime, ...] = ()
    ended_at: Mapping[str, dt.datetime] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Rows to write for one batch, each already deduplicated within the batch."""

    event_rows: list[dict[str, Any]]
    turns: list[TurnRow]
    sessions: dict[str, SessionChanges]
    next_offsets: dict[tuple[str, int], int]
    rejected: list[RejectedMessage]
    #: ``emitted_at`` of the batch's ``turn.completed`` events (one per (session, seq)).
    turns_emitted_at: tuple[dt.datetime, ...] = ()


def plan_batch(messages: Iterable[SourceMessage], opener: EventOpener | None = None) -> BatchPlan:
    """Decode ``messages`` (in consumption order), open the sealed ones with
    ``opener``, and plan their rows.

    Each record is decoded and planned on its own, before anything of it is
    merged into the plan (:func:`plan_each`): one that fails in any way (not a
    valid event, or any other exception while planning it) is listed in
    ``rejected`` with a reason, contributes no row, and still advances the
    offsets. The sink dead-letters it (``invalid: <reason>``); the other records
    of the batch, of its session or any other, are planned as if it were not there.
    """
    events: dict[tuple[str, int], tuple[Event, str]] = {}
    turns: dict[tuple[str, int], TurnRow] = {}
    sessions: dict[str, SessionChanges] = {}
    rejected: list[RejectedMessage] = []
    messages = list(messages)
    for _, (event, payload, row) in plan_each(messages, lambda m: _plan_record(m, opener), rejected):
        event_key = (event.session_id, event.seq)
        held = events.get(event_key)
        if held is None or event.epoch > held[0].epoch:
            events[event_key] = (event, payload)
        changes = sessions.get(event.session_id)
        if changes is None:
            changes = sessions[event.session_id] = SessionChanges(event.session_id)
        changes.max_epoch = max(changes.max_epoch, event.epoch)
        changes.seqs.add(event.seq)
        if isinstance(event, SessionStarted):
            changes.started = event
        elif isinstance(event, SessionEnded):
            changes.ended = event
        elif row is not None:
            turn_key = (row.session_id, row.turn_index)
            current = turns.get(turn_key)
            if current is None or turn_update_wins(current.status, current.epoch, current.seq, row):
                turns[turn_key] = row
    event_rows = [
        {
            "session_id": event.session_id,
            "seq": event.seq,
            "epoch": event.epoch,
            "event_id": str(event.event_id),
            "type": type(event).__struct_config__.tag,
            "emitted_at": event.emitted_at,
            "payload": payload,
        }
        for event, payload in events.values()
    ]
    turns_emitted_at = tuple(event.emitted_at for event, _ in events.values() if isinstance(event, TurnCompleted))
    return BatchPlan(event_rows, list(turns.values()), sessions, next_offsets(messages), rejected, turns_emitted_at)


def plan_each(
    messages: Iterable[SourceMessage], plan: Callable[[SourceMessage], T], rejected: list[RejectedMessage]
) -> Iterator[tuple[SourceMessage, T]]:
    """``(message, plan(message))`` for each message whose ``plan`` returns; each one
    whose ``plan`` raises is appended to ``rejected`` instead, with a reason.

    The rule of every projection of the transcript: any failure of one record
    (an ``EventValidationError``: its reason; any other exception: ``cannot be
    planned (<type>)``, logged with the record's topic, partition and offset,
    never its content) refuses that record alone, and the others go on.
    ``plan`` must leave nothing behind when it raises: the caller merges what it
    returns.
    """
    for message in messages:
        try:
            planned = plan(message)
        except EventValidationError as e:
            rejected.append(RejectedMessage(message, e.reason, e.reason_class))
            continue
        except Exception as e:  # a planning bug must not stop the consumer: this record alone is refused
            logger.warning(
                "planning %s[%d]@%d failed (%s): refused", message.topic, message.partition, message.offset,
                type(e).__name__, exc_info=logger.isEnabledFor(logging.DEBUG),  # a traceback may quote content
            )
            rejected.append(RejectedMessage(message, f"cannot be planned ({type(e).__name__})"))
            continue
        yield message, planned


def _plan_record(message: SourceMessage, opener: EventOpener | None) -> tuple[Event, str, TurnRow | None]:
    """One record's share of a plan: its event (opened, if sealed), its payload as
    text (the ``session_events.payload`` column: the opened event, so every reader of
    the store sees one shape) and, for a turn, its row. Nothing is merged here, so a
    record that raises leaves no trace in the plan.

    Raises:
        EventValidationError: the value is not a valid event, or it is sealed and does
            not open (``SealedContentError``: no keyring, an unknown KEK, altered).
    """
    event = decode_event(message.value)
    if is_sealed(event):
        event = open_sealed(event, opener)
        payload = encode_event(event).decode("utf-8")
    else:
        payload = message.value.decode("utf-8")  # valid: decode_event accepted it as UTF-8 JSON
    row = TurnRow.from_event(event) if isinstance(event, TurnPartial | TurnCompleted) else None
    return event, payload, row


def advance_contiguous(last_seq: int, seqs: Iterable[int]) -> int:
    """The highest seq reachable from ``last_seq`` through consecutive ``seqs``.

    >>> advance_contiguous(4, {3, 5, 6, 8})
    6
    """
    present = set(seqs)
    while last_seq + 1 in present:
        last_seq += 1
    return last_seq


def merge_session(
    stored: Mapping[Any, Any] | None,  # a RowMapping (its keys typed as str or column)
    changes: SessionChanges,
    last_seq: int,
) -> dict[str, Any]:
    """The ``sessions`` row after a batch: stored values, overlaid by the batch's.

    Status only moves forward (active -> ended; finalized and abandoned stay);
    the aggregate columns are never written here: only the guarded finalize
    (``SqlStore.finalize_session``) computes them, from the persisted rows.
    """
    row: dict[str, Any] = {
        "id": changes.session_id,
        "fleet": None,
        "agent_id": None,
        "status": SessionStatus.ACTIVE,
        "started_at": None,
        "ended_at": None,
        "end_reason": None,
        "epoch": 0,
        "last_seq": -1,
        "end_seq": None,
        "metadata": None,
    }
    if stored is not None:
        row.update({key: stored[key] for key in row if key != "id"})
    if changes.started is not None and row["started_at"] is None:
        started = changes.started
        row.update(
            fleet=started.fleet,
            agent_id=started.agent_id,
            started_at=started.started_at,
            metadata=started.metadata,
        )
    if changes.ended is not None and row["end_seq"] is None:
        ended = changes.ended
        row.update(ended_at=ended.ended_at, end_reason=ended.reason, end_seq=ended.seq)
        if row["status"] == SessionStatus.ACTIVE:
            row["status"] = SessionStatus.ENDED
    row["epoch"] = max(row["epoch"], changes.max_epoch)
    row["last_seq"] = max(row["last_seq"], last_seq)
    return row


def ready_to_finalize(row: Mapping[str, Any]) -> bool:
    """Whether a ``sessions`` row as :func:`merge_session` leaves it is ended and
    complete in the store (every seq up to ``end_seq`` applied), not yet finalized.

    The same test as the ``WHERE`` of ``SqlStore.finalize_session``, which stays
    the arbiter (finalize once): this only spares the sink an ``UPDATE`` for the
    sessions of a batch that cannot match it.

    >>> ready_to_finalize({"status": "ended", "end_seq": 6, "last_seq": 6})
    True
    >>> ready_to_finalize({"status": "ended", "end_seq": 6, "last_seq": 4})
    False
    """
    return row["status"] == SessionStatus.ENDED and row["end_seq"] is not None and row["last_seq"] >= row["end_seq"]
