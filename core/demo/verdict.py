"""The demo's verdict: does the store hold every input turn exactly once, in order?

For each session it compares three things:
- the input transcript (what the agent said),
- the store (``transcript_turns`` and the finalized ``sessions`` row),
- an independent fold of the stored event log (``turnlog.audit.fold_events``).

Completed turns must equal the input turns one for one (speaker and text), in
order. A SIGKILLed agent leaves its unfinished turn ``interrupted``; that turn
must hold a word prefix of the turn the resumed agent then re-spoke in full.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import select

from turnlog.audit import fold_events
from turnlog.demo.transcripts import InputTurn, token_counts
from turnlog.sinks import SqlStore
from turnlog.sinks.tables import session_events, sessions, transcript_turns

__all__ = ["SessionVerdict", "judge_session"]

DURATION_TOLERANCE_SECONDS = 0.002


@dataclass(slots=True)
class SessionVerdict:
    session_id: str
    input_turns: int
    stored_turns: int
    complete_turns: int
    interrupted_turns: int
    status: str
    duration_seconds: float | None
    expected_duration_seconds: float
    input_tokens: int | None
    output_tokens: int | None
    events: int
    kills: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def judge_session(store: SqlStore, session_id: str, expected: list[InputTurn], kills: int) -> SessionVerdict:
    """Compare one session's store rows with its input and with a fold of its event log."""
    with store.engine.connect() as conn:
        row = conn.execute(select(sessions).where(sessions.c.id == session_id)).mappings().first()
        turns = conn.execute(
            select(transcript_turns).where(transcript_turns.c.session_id == session_id).order_by(transcript_turns.c.turn_index)
        ).mappings().all()
        payloads = conn.execute(
            select(session_events.c.payload).where(session_events.c.session_id == session_id).order_by(session_events.c.seq)
        ).scalars().all()
    expected_duration = round(max(t.end_s for t in expected) - expected[0].start_s, 3)
    verdict = SessionVerdict(
        session_id=session_id,
        input_turns=len(expected),
        stored_turns=len(turns),
        complete_turns=sum(1 for t in turns if t["status"] == "complete"),
        interrupted_turns=sum(1 for t in turns if t["status"] == "interrupted"),
        status=row["status"] if row else "missing",
        duration_seconds=row["duration_seconds"] if row else None,
        expected_duration_seconds=expected_duration,
        input_tokens=row["input_tokens"] if row else None,
        output_tokens=row["output_tokens"] if row else None,
        events=len(payloads),
        kills=kills,
    )
    problems = verdict.problems
    if row is None:
        problems.append("session missing from the store")
        return verdict
    if row["status"] != "finalized":
        problems.append(f"status is {row['status']}, not finalized")

    _check_turns(turns, expected, kills, problems)

    folded = fold_events(payloads)
    if folded.seqs != list(range(len(folded.seqs))):
        problems.append("session_events seqs are not 0..n-1")
    if folded.end_seq is None or row["last_seq"] != folded.end_seq:
        problems.append(f"last_seq {row['last_seq']} != end seq {folded.end_seq}")
    recomputed = {
        "turn_count": folded.turn_count,
        "interrupted_turn_count": folded.interrupted_turn_count,
        "input_tokens": folded.input_tokens,
        "output_tokens": folded.output_tokens,
    }
    for name, value in recomputed.items():
        if row[name] != value:
            problems.append(f"{name} is {row[name]}, a recomputation from session_events gives {value}")
    if [(t.status, t.text) for t in folded.ordered_turns] != [(t["status"], t["text"]) for t in turns]:
        problems.append("transcript_turns differ from a fold of session_events")
    for name, value in (("duration_seconds (log)", folded.duration_seconds), ("duration_seconds (input)", expected_duration)):
        if row["duration_seconds"] is None or value is None or abs(row["duration_seconds"] - value) > DURATION_TOLERANCE_SECONDS:
            problems.append(f"duration_seconds is {row['duration_seconds']}, {name} gives {value}")
    input_tokens = sum(token_counts(t)[0] for t in expected)
    output_tokens = sum(token_counts(t)[1] for t in expected)
    if (row["input_tokens"], row["output_tokens"]) != (input_tokens, output_tokens):
        problems.append(
            f"tokens are {row['input_tokens']}/{row['output_tokens']}, the input gives {input_tokens}/{output_tokens}"
        )
    return verdict


def _check_turns(turns: list[Any], expected: list[InputTurn], kills: int, problems: list[str]) -> None:
    if [t["turn_index"] for t in turns] != list(range(len(turns))):
        problems.append("turn indices are not 0..n-1")
    partial = [t["turn_index"] for t in turns if t["status"] == "partial"]
    if partial:
        problems.append(f"turns still partial after the end: {partial}")
    complete = [(t["speaker"], t["text"]) for t in turns if t["status"] == "complete"]
    wanted = [(t.speaker, t.text) for t in expected]
    if complete != wanted:
        have, want = Counter(complete), Counter(wanted)
        missing = sum((want - have).values())
        duplicated = sum((have - want).values())
        if missing:
            problems.append(f"{missing} input turns missing")
        if duplicated:
            problems.append(f"{duplicated} turns stored more than once or altered")
        if not missing and not duplicated:
            problems.append("turns out of order")
    interrupted = [i for i, t in enumerate(turns) if t["status"] == "interrupted"]
    if len(interrupted) > kills:
        problems.append(f"{len(interrupted)} interrupted turns but only {kills} kills")
    for i in interrupted:
        cut = turns[i]
        retold = next((t for t in turns[i + 1 :] if t["status"] == "complete"), None)
        if retold is None or retold["speaker"] != cut["speaker"] or not _is_word_prefix(cut["text"], retold["text"]):
            problems.append(f"interrupted turn {cut['turn_index']} is not a prefix of the turn re-spoken after it")


def _is_word_prefix(part: str, whole: str) -> bool:
    return whole == part or whole.startswith(part + " ")
