"""The chaos run's latency figures (pure): the agents' latency files, percentiles, the windows
of each fault, catch-up, and the table per fault kind."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from turnlog.tools.demo.agent import _play, replay_plan
from turnlog.tools.demo.latency import (
    CompletedTurn,
    FaultWindow,
    LatencyLog,
    LatencyReader,
    StoredTurns,
    figures_by_kind,
    format_table,
    latencies_in,
    percentile,
)

from tests.unit.demo_turns import OVERLAPPING_TURNS


def call(turn_index: int, started: float, seconds: float, session_id: str = "s") -> CompletedTurn:
    return CompletedTurn(session_id, turn_index, started, seconds)


def test_percentiles_follow_the_nearest_rank_rule():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0 and percentile(values, 100) == 100.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 0)


def test_the_reader_takes_whole_lines_as_they_are_appended_and_skips_a_torn_one(tmp_path):
    log = LatencyLog(tmp_path / "agent1-s.jsonl")
    log.write(call(0, 10.0, 0.5))
    reader = LatencyReader(tmp_path)
    assert reader.read() == [call(0, 10.0, 0.5)]
    with (tmp_path / "agent1-s.jsonl").open("ab") as file:
        file.write(b'{"session_id": "s", "turn_in')  # a line still being written
    assert reader.read() == [call(0, 10.0, 0.5)]
    with (tmp_path / "agent1-s.jsonl").open("ab") as file:
        file.write(b'dex": 1, "started": 11.0, "seconds": 0.25}\n{"torn\n')  # completed, then a torn line
    LatencyLog(tmp_path / "agent2-t.jsonl").write(call(4, 12.0, 1.0, "t"))
    assert reader.read() == [call(0, 10.0, 0.5), call(1, 11.0, 0.25), call(4, 12.0, 1.0, "t")]
    assert reader.skipped_lines == 1
    log.close()


def test_a_call_counts_in_every_window_its_span_overlaps():
    calls = [call(0, 0.0, 1.0), call(1, 4.0, 3.0), call(2, 9.5, 0.2), call(3, 12.0, 0.1)]
    assert latencies_in(calls, 5.0, 10.0) == [3.0, 0.2]  # began before the window and returned inside it; inside
    assert latencies_in(calls, 1.0, 1.0) == [1.0]


def test_catch_up_is_when_every_turn_returned_by_then_was_first_seen_stored():
    stored = StoredTurns()
    calls = [call(0, 0.0, 1.0), call(1, 2.0, 1.0), call(2, 5.0, 1.0)]
    stored.observe([("s", 0)], queried_at=2.0)
    assert stored.caught_up_at(calls, before=3.5) is None  # turn 1 returned at 3.0, not seen stored yet
    stored.observe([("s", 0), ("s", 1)], queried_at=8.0)
    assert stored.caught_up_at(calls, before=3.5) == 8.0
    assert stored.caught_up_at(calls, before=1.5) == 2.0
    assert stored.caught_up_at(calls, before=0.5) == 0.5  # nothing had returned yet
    assert stored.first_seen[("s", 0)] == 2.0  # the first sighting stays
    assert stored.pending(calls) == [call(2, 5.0, 1.0)]


def test_the_table_has_a_row_per_kind_and_one_for_the_calls_outside_every_fault():
    calls = [call(n, float(n), 0.01) for n in range(100)]  # one call a second
    calls.append(call(100, 20.5, 4.0))  # slow: inside a pause
    windows = [
        FaultWindow("broker pause", start=20.0, lifted=50.0, end=55.0, held=30.0, caught_up=5.0),
        FaultWindow("broker pause", start=70.0, lifted=80.0, end=None, held=10.0, recovered=False),
        FaultWindow("sink", start=60.0, lifted=60.0, end=62.0, caught_up=2.0),
    ]
    pause, sink, calm = figures_by_kind(windows, calls, run_end=90.0)
    assert (pause.kind, pause.count, pause.recovered, pause.held_median_seconds) == ("broker pause", 2, 1, 20.0)
    assert pause.calls == 36 + 21 + 1  # 20..55 and 70..90 (never caught up: until the end), and the slow one
    assert pause.max_ms == 4000.0 and pause.p50_ms == 10.0
    assert (pause.caught_up_median_seconds, pause.caught_up_max_seconds) == (5.0, 5.0)
    assert (sink.calls, sink.caught_up_max_seconds) == (3, 2.0)
    assert (calm.kind, calm.calls) == ("no fault", 100 - 36 - 21 - 3)
    table = format_table([pause, sink, calm])
    assert "broker pause" in table and "4000ms" in table and "1/2" in table


class FakeSession:
    session_id = "fake"

    def __init__(self) -> None:
        self.completed: list[int] = []

    def update_partial(self, turn_index, speaker, text, *, started_at) -> None:  # noqa: ANN001
        pass

    async def complete_turn(self, turn_index, speaker, text, **fields) -> None:  # noqa: ANN001, ANN003
        await asyncio.sleep(0.01)
        self.completed.append(turn_index)


async def test_the_agent_reports_each_complete_turn_that_returned_with_its_start_and_duration():
    session, reported = FakeSession(), []
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert await _play(session, replay_plan(OVERLAPPING_TURNS), speed=50.0, base_time=base,
                       terminating=asyncio.Event(), on_completed=reported.append) is True
    assert [c.turn_index for c in reported] == session.completed == [1, 0, 3, 2, 4, 5]
    assert all(c.session_id == "fake" and 0.01 <= c.seconds < 1.0 for c in reported)
    assert [c.started for c in reported] == sorted(c.started for c in reported)
