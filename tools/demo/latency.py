"""What the chaos run's agents felt during each fault: ``complete_turn`` latencies, and catch-up.

Each agent process appends one JSON line per ``complete_turn`` that returned to a file of
its own (:class:`LatencyLog`, ``<run log dir>/latency/<agent>.jsonl``): the session, the
turn index, when the call began and how long it took. The times are ``time.monotonic()``
values, which on Linux are ``CLOCK_MONOTONIC``: one clock for every process of the host, so
the harness compares them with its own. The harness reads the files as they grow
(:class:`LatencyReader`) and watches the store for the turns stored complete
(:class:`StoredTurns`, when it first saw each one). From both:

- the latency during a fault: the calls whose span overlaps the fault's window, from the
  fault's start until the pipeline caught up after it (:func:`latencies_in`, percentiles by
  :func:`percentile`);
- the catch-up after a fault: from the moment the fault ended (the node restarted, the
  process continued) until the store held every turn whose ``complete_turn`` had returned
  by then (:meth:`StoredTurns.caught_up_at`);
- the turns an agent was told were recorded and the store never held
  (:meth:`StoredTurns.pending` at the end of the run): a durability violation of its own.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

__all__ = [
    "CompletedTurn",
    "LatencyLog",
    "LatencyReader",
    "StoredTurns",
    "FaultWindow",
    "KindFigures",
    "percentile",
    "latencies_in",
    "figures_by_kind",
    "format_table",
]


class CompletedTurn(msgspec.Struct, frozen=True):
    """One ``complete_turn`` call that returned: ``started`` (monotonic seconds) and ``seconds`` it took."""

    session_id: str  # the session's key (``RecordedSession.session_id``), as the store names it
    turn_index: int
    started: float
    seconds: float

    @property
    def returned(self) -> float:
        return self.started + self.seconds

    @property
    def key(self) -> tuple[str, int]:
        return self.session_id, self.turn_index


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(CompletedTurn).decode


class LatencyLog:
    """An agent's latency file: :meth:`write` appends one line per returned call and flushes it
    (a SIGKILL loses at most the line being written; the reader skips a torn one)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] = path.open("ab")

    def write(self, turn: CompletedTurn) -> None:
        self._file.write(_encode(turn) + b"\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class LatencyReader:
    """Reads every ``*.jsonl`` of ``folder`` as the agents append to them; thread-safe.

    :meth:`read` returns every call read so far: it takes only whole lines (a line still
    being written is read next time) and skips a line that does not parse (torn by a SIGKILL).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._offsets: dict[Path, int] = {}
        self._turns: list[CompletedTurn] = []
        self._lock = threading.Lock()
        self.skipped_lines = 0

    def read(self) -> list[CompletedTurn]:
        with self._lock:
            for path in sorted(self.folder.glob("*.jsonl")):
                offset = self._offsets.get(path, 0)
                try:
                    with path.open("rb") as file:
                        file.seek(offset)
                        data = file.read()
                except OSError:
                    continue
                end = data.rfind(b"\n") + 1
                for line in data[:end].splitlines():
                    try:
                        self._turns.append(_decode(line))
                    except msgspec.DecodeError:
                        self.skipped_lines += 1
                self._offsets[path] = offset + end
            return list(self._turns)


@dataclass(slots=True)
class StoredTurns:
    """When the harness first saw each turn stored complete (``(session key, turn index)`` ->
    monotonic seconds). :meth:`observe` is fed by a poll of the store; thread-safe."""

    first_seen: dict[tuple[str, int], float] = field(default_factory=dict)
    #: monotonic time at which the newest :meth:`observe` call's query began
    observed_at: float = -math.inf
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, stored: Iterable[tuple[str, int]], queried_at: float) -> None:
        """``stored``: the turns stored complete, as a query begun at ``queried_at`` found them."""
        with self._lock:
            for key in stored:
                self.first_seen.setdefault(key, queried_at)
            self.observed_at = max(self.observed_at, queried_at)

    def pending(self, turns: Iterable[CompletedTurn]) -> list[CompletedTurn]:
        """Those of ``turns`` not seen stored yet."""
        with self._lock:
            return [t for t in turns if t.key not in self.first_seen]

    def caught_up_at(self, turns: Iterable[CompletedTurn], before: float) -> float | None:
        """When the store held every turn of ``turns`` whose call returned at or before
        ``before`` (monotonic): the latest first sighting among them (``before`` when there are
        none, or when all were seen earlier); None while one of them is not seen stored."""
        latest = before
        with self._lock:
            for turn in turns:
                if turn.returned > before:
                    continue
                seen = self.first_seen.get(turn.key)
                if seen is None:
                    return None
                latest = max(latest, seen)
        return latest


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 < q <= 100) of ``values`` by the nearest-rank rule: the
    smallest value with at least q % of the values at or below it.

    Raises:
        ValueError: ``values`` is empty or ``q`` is outside (0, 100].
    """
    if not values:
        raise ValueError("no values")
    if not 0 < q <= 100:
        raise ValueError(f"percentile {q} is outside (0, 100]")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """One fault of a run, in monotonic seconds: it began at ``start``, was lifted at ``lifted``
    (the node restarted, the process continued; ``start`` for an instant kill), and had
    recovered at ``end`` (None: never), which is where its latency window ends.
    ``held``: seconds it was held (None: instant); ``caught_up``: seconds from ``lifted`` until
    the store held every turn whose call had returned by then (None: never)."""

    kind: str
    start: float
    lifted: float
    end: float | None
    held: float | None = None
    recovered: bool = True
    caught_up: float | None = None


def latencies_in(turns: Iterable[CompletedTurn], start: float, end: float) -> list[float]:
    """Durations (seconds) of the calls whose span [started, returned] overlaps [start, end]."""
    return [t.seconds for t in turns if t.started <= end and t.returned >= start]


@dataclass(frozen=True, slots=True)
class KindFigures:
    """One fault kind's row of the table (latencies in milliseconds, times in seconds)."""

    kind: str
    count: int
    recovered: int
    held_median_seconds: float | None
    calls: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    caught_up_median_seconds: float | None
    caught_up_max_seconds: float | None

    def as_json(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


def figures_by_kind(
    windows: Sequence[FaultWindow], turns: Sequence[CompletedTurn], *, run_end: float
) -> list[KindFigures]:
    """The table: per kind (in first-seen order), the calls during its windows (a call that
    overlaps two windows of the kind counts once), held and catch-up times; then a row
    ``no fault`` for the calls that overlap no window at all. A window never caught up
    counts its latencies until ``run_end``."""
    def during(turn: CompletedTurn, of: Sequence[FaultWindow]) -> bool:
        return any(_overlaps(turn, w.start, w.end if w.end is not None else run_end) for w in of)

    rows: list[KindFigures] = []
    for kind in dict.fromkeys(w.kind for w in windows):
        of_kind = [w for w in windows if w.kind == kind]
        seconds = [t.seconds for t in turns if during(t, of_kind)]
        held = [w.held for w in of_kind if w.held is not None]
        caught_up = [w.caught_up for w in of_kind if w.caught_up is not None]
        rows.append(_row(kind, len(of_kind), sum(w.recovered for w in of_kind), held, seconds, caught_up))
    calm = [t.seconds for t in turns if not during(t, windows)]
    rows.append(_row("no fault", 0, 0, [], calm, []))
    return rows


def _overlaps(turn: CompletedTurn, start: float, end: float) -> bool:
    return turn.started <= end and turn.returned >= start


def _row(kind: str, count: int, recovered: int, held: list[float], seconds: list[float],
         caught_up: list[float]) -> KindFigures:
    def ms(q: float) -> float | None:
        return round(percentile(seconds, q) * 1000, 1) if seconds else None

    return KindFigures(
        kind=kind,
        count=count,
        recovered=recovered,
        held_median_seconds=round(statistics.median(held), 1) if held else None,
        calls=len(seconds),
        p50_ms=ms(50),
        p99_ms=ms(99),
        max_ms=round(max(seconds) * 1000, 1) if seconds else None,
        caught_up_median_seconds=round(statistics.median(caught_up), 2) if caught_up else None,
        caught_up_max_seconds=round(max(caught_up), 2) if caught_up else None,
    )


def format_table(rows: Sequence[KindFigures]) -> str:
    """The rows as a text table (``-`` where a figure has no value)."""

    def show(value: float | None, unit: str = "") -> str:
        return "-" if value is None else f"{value:g}{unit}"

    header = (f"{'fault kind':<26} {'count':>5} {'held':>7} {'calls':>6} {'p50':>9} {'p99':>9} {'max':>9}"
              f" {'caught up (median/max)':>23}")
    lines = [header, "-" * len(header)]
    for row in rows:
        count = f"{row.recovered}/{row.count}" if row.count else "-"
        caught_up = f"{show(row.caught_up_median_seconds, 's')} / {show(row.caught_up_max_seconds, 's')}"
        lines.append(
            f"{row.kind:<26} {count:>5} {show(row.held_median_seconds, 's'):>7} {row.calls:>6}"
            f" {show(row.p50_ms, 'ms'):>9} {show(row.p99_ms, 'ms'):>9} {show(row.max_ms, 'ms'):>9}"
            f" {'' if not row.count else caught_up:>23}"
        )
    return "\n".join(lines)
