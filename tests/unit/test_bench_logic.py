"""The benchmark's pure parts: workload, rate control, percentiles, lag slope, profile summary."""

from pathlib import Path

import pytest

from turnlog.bench.baselines import percentile
from turnlog.bench.load import plans_for_rate
from turnlog.bench.probes import Sample
from turnlog.bench.profile import summarize
from turnlog.bench.runner import _lag_slope
from turnlog.bench.workload import encoded_events, events_per_second, plan_sessions
from turnlog.schemas import SessionEnded, SessionStarted, TurnCompleted, decode_event

SESSIONS = Path(__file__).resolve().parents[3] / "shared" / "data" / "sessions"


@pytest.fixture(scope="module")
def plans():
    return plan_sessions(SESSIONS, 30, 12, run_id="t")


def test_each_session_is_started_then_its_turns_in_seq_order_then_ended(plans):
    events = encoded_events(plans, flush_interval=0.5, speed=10)
    by_session: dict[str, list] = {}
    for key, raw in events:
        event = decode_event(raw)
        assert event.session_id == key
        by_session.setdefault(key, []).append(event)
    assert set(by_session) == {p.session_id for p in plans}
    for plan in plans:
        got = by_session[plan.session_id]
        assert [e.seq for e in got] == list(range(len(got)))
        assert isinstance(got[0], SessionStarted) and isinstance(got[-1], SessionEnded)
        completed = [e for e in got if isinstance(e, TurnCompleted)]
        assert [c.text for c in completed] == [t.text for t in plan.turns]


def test_sessions_on_the_same_transcript_say_different_windows(plans):
    files = len({p.turns[0].session_id for p in plans})
    assert plans[0].turns[0].session_id == plans[files].turns[0].session_id
    assert plans[0].turns != plans[files].turns


def test_the_offered_rate_is_set_by_how_many_sessions_run(plans):
    one = events_per_second(plans[:1], speed=10, flush_interval=0.5)
    chosen = plans_for_rate(plans, 5 * one, speed=10, flush_interval=0.5)
    assert 2 <= len(chosen) <= 15
    assert events_per_second(chosen, speed=10, flush_interval=0.5) >= 5 * one
    with pytest.raises(ValueError, match="use more sessions"):
        plans_for_rate(plans, 1e9, speed=10, flush_interval=0.5)


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50, 99, 100)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) != percentile([], 50)  # NaN


def test_lag_slope_tells_flat_from_growing():
    flat = [Sample(t, 1000 + 100 * t, 1000 + 100 * t, 500, 500) for t in range(10)]
    growing = [Sample(t, 1000 + 100 * t, 1000 + 60 * t, 500, 500) for t in range(10)]
    assert _lag_slope(flat) == 0
    assert _lag_slope(growing) == pytest.approx(40)


def test_profile_summary_ranks_leaf_frames_and_counts_turnlog_code(tmp_path):
    stacks = tmp_path / "p.txt"
    stacks.write_text(
        "main (core/cli.py:1);apply (sinks/base.py:10) 30\n"
        "main (core/cli.py:1);execute (psycopg/cursor.py:5) 60\n"
        "main (core/cli.py:1);select (selectors.py:9) 10\n"
    )
    summary = summarize("sink", stacks)
    assert summary.samples == 100
    assert summary.top_self[0] == ("execute (psycopg/cursor.py:5)", 0.6)
    assert summary.own_code_share == pytest.approx(0.3)
