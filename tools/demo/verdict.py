"""The demo's verdict: does the store hold every input turn exactly once, in order?

For each session it compares three things:
- the input transcript (what the agents said),
- the store (``transcript_turns`` and the finalized ``sessions`` row),
- an independent fold of the stored event log (``turnlog.ops.audit.fold_events``).

What "in order" means with overlapping turns and crashes
(``turnlog.tools.demo.transcripts`` has the replay's conventions). Each agent
process that wrote a session is a *generation*; its turns carry its epoch.
Generation ``g`` says the input turns ``pending(g)`` = those not stored
complete by the generations before it, in input order, at the turn indexes
``base(g) + 0, 1, 2, ...`` where ``base(g)`` is one past the highest turn
index the earlier generations stored (the first generation: ``pending`` is
every input turn and ``base`` is 0, so input turn ``i`` is turn ``i``). So:

- every input turn is stored ``complete`` exactly once, with its speaker,
  start time and text (a stored turn names its input turn by speaker and start
  time);
- every stored turn sits at the index its generation gave its input turn:
  sorted by turn index, the complete turns are each generation's completed
  turns in input order, generation after generation, and so the turns a
  resumed agent said again come after every turn stored before its resume;
- a turn a SIGKILL left unfinished is ``interrupted`` (never ``partial``),
  belongs to a generation that a later one replaced, and holds a word prefix
  of its input turn, which a later generation stored complete;
- no more generations than kills + 1;
- the aggregates equal a recomputation from the log and from the input.

Problems are typed (:class:`Problem`: a :class:`ProblemKind` and a count),
so reports add them up by kind; their ``detail`` is the readable text.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import select

from turnlog.ops.audit import fold_events
from turnlog.schemas import SessionStatus, TurnStatus
from turnlog.sinks import SqlStore
from turnlog.sinks.tables import session_events, sessions, transcript_turns
from turnlog.tools.demo.transcripts import InputTurn, recording_time, token_counts, turn_key

__all__ = [
    "ProblemKind",
    "Problem",
    "VerdictTurn",
    "SessionVerdict",
    "judge_session",
    "check_turns",
    "problem_totals",
]

DURATION_TOLERANCE_SECONDS = 0.002


class ProblemKind(enum.Enum):
    """What is wrong; ``count`` of a :class:`Problem` says how many of it."""

    SESSION_MISSING = "session_missing"
    NOT_FINALIZED = "not_finalized"
    LOST_TURNS = "lost_turns"  # input turns never stored complete
    DUPLICATED_TURNS = "duplicated_turns"  # extra complete copies of an input turn
    ALTERED_TURNS = "altered_turns"  # a complete turn whose text differs, or that names no input turn
    OUT_OF_ORDER = "out_of_order"  # turns not at the index their generation gave them
    PARTIAL_AFTER_END = "partial_after_end"
    BAD_INTERRUPTED = "bad_interrupted"  # an interrupted turn that is not a prefix of a turn said again later
    EXTRA_GENERATIONS = "extra_generations"  # more writers (epochs) than kills + 1
    LOG_MISMATCH = "log_mismatch"  # the store differs from a fold of its own event log
    WRONG_AGGREGATE = "wrong_aggregate"  # a figure differs from a recomputation
    KILL_MISSED = "kill_missed"  # a planned SIGKILL did not happen


@dataclass(frozen=True, slots=True)
class Problem:
    kind: ProblemKind
    count: int
    detail: str

    def __str__(self) -> str:
        return self.detail

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "count": self.count, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class VerdictTurn:
    """A stored turn, as the verdict needs it (a ``transcript_turns`` row)."""

    turn_index: int
    speaker: str
    text: str
    status: str
    started_at: dt.datetime
    epoch: int

    @classmethod
    def from_row(cls, row: Any) -> VerdictTurn:
        return cls(row["turn_index"], row["speaker"], row["text"], row["status"], row["started_at"], row["epoch"])


@dataclass(slots=True)
class SessionVerdict:
    session_id: str  # the session's key
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
    generations: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["problems"] = [p.as_json() for p in self.problems]
        return {**data, "ok": self.ok}


def problem_totals(problems: Iterable[Problem]) -> dict[ProblemKind, int]:
    """The sum of ``count`` per kind (every kind present, 0 when none)."""
    totals = dict.fromkeys(ProblemKind, 0)
    for problem in problems:
        totals[problem.kind] += problem.count
    return totals


def judge_session(
    store: SqlStore, session_id: str, expected: list[InputTurn], kills: int, *, base_time: dt.datetime
) -> SessionVerdict:
    """Compare one session's store rows with its input and with a fold of its event log.

    ``session_id`` is the session's key (``<fleet>:<id>``, as the recorder wrote it and the store
    holds it); ``base_time`` is second 0 of the recording (the agents' ``--base-time``);
    ``kills`` how many of the session's agents were SIGKILLed.
    """
    with store.engine.connect() as conn:
        row = conn.execute(select(sessions).where(sessions.c.id == session_id)).mappings().first()
        turns = conn.execute(
            select(transcript_turns)
            .where(transcript_turns.c.session_id == session_id)
            .order_by(transcript_turns.c.turn_index)
        ).mappings().all()
        payloads = conn.execute(
            select(session_events.c.payload)
            .where(session_events.c.session_id == session_id)
            .order_by(session_events.c.seq)
        ).scalars().all()
    rows = [VerdictTurn.from_row(t) for t in turns]
    expected_duration = round(max(t.end_s for t in expected) - expected[0].start_s, 3)
    verdict = SessionVerdict(
        session_id=session_id,
        input_turns=len(expected),
        stored_turns=len(rows),
        complete_turns=sum(1 for t in rows if t.status == TurnStatus.COMPLETE),
        interrupted_turns=sum(1 for t in rows if t.status == TurnStatus.INTERRUPTED),
        status=row["status"] if row else "missing",
        duration_seconds=row["duration_seconds"] if row else None,
        expected_duration_seconds=expected_duration,
        input_tokens=row["input_tokens"] if row else None,
        output_tokens=row["output_tokens"] if row else None,
        events=len(payloads),
        kills=kills,
        generations=len({t.epoch for t in rows}),
    )
    problems = verdict.problems
    if row is None:
        problems.append(Problem(ProblemKind.SESSION_MISSING, 1, "session missing from the store"))
        return verdict
    if row["status"] != SessionStatus.FINALIZED:
        problems.append(Problem(ProblemKind.NOT_FINALIZED, 1, f"status is {row['status']}, not finalized"))

    problems.extend(check_turns(rows, expected, base_time=base_time, kills=kills))

    folded = fold_events(payloads)
    if folded.seqs != list(range(len(folded.seqs))):
        problems.append(Problem(ProblemKind.LOG_MISMATCH, 1, "session_events seqs are not 0..n-1"))
    if folded.end_seq is None or row["last_seq"] != folded.end_seq:
        problems.append(Problem(ProblemKind.LOG_MISMATCH, 1, f"last_seq {row['last_seq']} != end seq {folded.end_seq}"))
    folded_turns = [(t.turn_index, t.status, t.text) for t in folded.ordered_turns]
    if folded_turns != [(t.turn_index, t.status, t.text) for t in rows]:
        problems.append(Problem(ProblemKind.LOG_MISMATCH, 1, "transcript_turns differ from a fold of session_events"))
    recomputed = {
        "turn_count": folded.turn_count,
        "interrupted_turn_count": folded.interrupted_turn_count,
        "input_tokens": folded.input_tokens,
        "output_tokens": folded.output_tokens,
    }
    for name, value in recomputed.items():
        if row[name] != value:
            problems.append(
                Problem(ProblemKind.WRONG_AGGREGATE, 1,
                        f"{name} is {row[name]}, a recomputation from session_events gives {value}")
            )
    for name, seconds in (("duration_seconds (log)", folded.duration_seconds),
                          ("duration_seconds (input)", expected_duration)):
        if (
            row["duration_seconds"] is None
            or seconds is None
            or abs(row["duration_seconds"] - seconds) > DURATION_TOLERANCE_SECONDS
        ):
            problems.append(Problem(ProblemKind.WRONG_AGGREGATE, 1,
                                    f"duration_seconds is {row['duration_seconds']}, {name} gives {seconds}"))
    input_tokens = sum(token_counts(t)[0] for t in expected)
    output_tokens = sum(token_counts(t)[1] for t in expected)
    if (row["input_tokens"], row["output_tokens"]) != (input_tokens, output_tokens):
        problems.append(
            Problem(
                ProblemKind.WRONG_AGGREGATE,
                1,
                f"tokens are {row['input_tokens']}/{row['output_tokens']}, the input gives"
                f" {input_tokens}/{output_tokens}",
            )
        )
    return verdict


def check_turns(
    rows: Sequence[VerdictTurn], expected: Sequence[InputTurn], *, base_time: dt.datetime, kills: int
) -> list[Problem]:
    """The problems of a session's stored turns against its input (module docstring).

    Pure: ``rows`` are the stored turns (any order), ``expected`` the input
    turns in input order, ``base_time`` second 0 of the recording, ``kills``
    how many of the session's agents were SIGKILLed.
    """
    problems: list[Problem] = []
    rows = sorted(rows, key=lambda r: r.turn_index)
    by_key = {turn_key(t.speaker, recording_time(base_time, t.start_s)): i for i, t in enumerate(expected)}
    source = {r.turn_index: by_key.get(turn_key(r.speaker, r.started_at)) for r in rows}

    partial = [r.turn_index for r in rows if r.status == TurnStatus.PARTIAL]
    if partial:
        problems.append(Problem(ProblemKind.PARTIAL_AFTER_END, len(partial),
                                f"turns still partial after the end: {_few(partial)}"))
    odd = [r.turn_index for r in rows if r.status not in tuple(TurnStatus)]
    if odd:
        problems.append(Problem(ProblemKind.ALTERED_TURNS, len(odd), f"turns with an unknown status: {_few(odd)}"))

    complete = [r for r in rows if r.status == TurnStatus.COMPLETE]
    altered = [
        r.turn_index for r in complete if source[r.turn_index] is None or r.text != expected[source[r.turn_index]].text  # type: ignore[index]
    ]
    if altered:
        problems.append(
            Problem(ProblemKind.ALTERED_TURNS, len(altered),
                    f"{len(altered)} complete turns differ from every input turn: {_few(altered)}")
        )
    copies = Counter(input_index for r in complete if (input_index := source[r.turn_index]) is not None)
    lost = [i for i in range(len(expected)) if copies[i] == 0]
    if lost:
        problems.append(Problem(ProblemKind.LOST_TURNS, len(lost), f"{len(lost)} input turns missing: {_few(lost)}"))
    duplicated = sum(n - 1 for n in copies.values() if n > 1)
    if duplicated:
        extra = sorted(i for i, n in copies.items() if n > 1)
        problems.append(
            Problem(ProblemKind.DUPLICATED_TURNS, duplicated,
                    f"{duplicated} turns stored complete more than once (input turns {_few(extra)})")
        )

    # Each generation's layout: where it must have put each input turn it said.
    by_epoch: dict[int, list[VerdictTurn]] = defaultdict(list)
    for r in rows:
        by_epoch[r.epoch].append(r)
    epochs = sorted(by_epoch)
    done: set[int] = set()
    highest = -1
    misplaced: list[int] = []
    for epoch in epochs:
        generation = by_epoch[epoch]
        said = [
            (r.turn_index, input_index)
            for r in generation
            if (input_index := source[r.turn_index]) is not None and input_index not in done
        ]
        # A lost input turn (reported above) may have vanished before this generation
        # resumed (so it said it again) or after: judge the order under the likelier case.
        fewest = min(
            (
                _misplaced(said, highest + 1, [i for i in range(len(expected)) if i not in done | gone])
                for gone in ({*lost}, set())
            ),
            key=len,
        )
        misplaced.extend(fewest)
        done.update(
            input_index
            for r in generation
            if r.status == TurnStatus.COMPLETE and (input_index := source[r.turn_index]) is not None
        )
        highest = max(highest, generation[-1].turn_index)
    if misplaced:
        problems.append(
            Problem(ProblemKind.OUT_OF_ORDER, len(misplaced),
                    f"{len(misplaced)} turns out of order (not where their agent put them): {_few(misplaced)}")
        )

    final_epoch = epochs[-1] if epochs else None
    completed_in = defaultdict(list)
    for r in complete:
        if source[r.turn_index] is not None:
            completed_in[source[r.turn_index]].append(r.epoch)
    bad = []
    for r in rows:
        if r.status != TurnStatus.INTERRUPTED:
            continue
        i = source[r.turn_index]
        if (
            i is None
            or r.epoch == final_epoch
            or not _is_word_prefix(r.text, expected[i].text)
            or not any(epoch > r.epoch for epoch in completed_in[i])
        ):
            bad.append(r.turn_index)
    if bad:
        problems.append(
            Problem(
                ProblemKind.BAD_INTERRUPTED,
                len(bad),
                f"{len(bad)} interrupted turns are not a word prefix of a turn a later agent said in full: {_few(bad)}",
            )
        )
    if len(epochs) > kills + 1:
        problems.append(
            Problem(ProblemKind.EXTRA_GENERATIONS, len(epochs) - kills - 1,
                    f"turns written in {len(epochs)} epochs but only {kills} kills")
        )
    return problems


def _misplaced(said: list[tuple[int, int]], base: int, pending: list[int]) -> list[int]:
    """Turn indexes of ``said`` ((turn index, input turn) of one generation) that
    are not at ``base`` + the input turn's position in ``pending``."""
    position = {i: n for n, i in enumerate(pending)}
    return [index for index, i in said if i not in position or index != base + position[i]]


def _few(items: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, items[:limit]))
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def _is_word_prefix(part: str, whole: str) -> bool:
    return whole == part or whole.startswith(part + " ")
