"""The benchmark's pure parts: workload, rate control, percentiles, lag slope, profile
summary, histogram bucket bounds, spool cost, resume summary."""

import asyncio
import math
import time
from pathlib import Path

import pytest

from turnlog.bench.baselines import percentile
from turnlog.bench.load import _sleep_until, plans_for_rate
from turnlog.bench.probes import Sample, SpoolCounters, bucket_quantile, lag_stats, spool_cost, spool_counters
from turnlog.bench.resume_probe import resume_summary
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


INF = float("inf")


def test_bucket_quantile_gives_the_bucket_that_holds_the_nearest_rank():
    # 100 commits: 90 <= 1 ms, 8 in (1, 2] ms, 2 in (2, 5] ms.
    buckets = [(0.0005, 0), (0.001, 90), (0.002, 98), (0.005, 100), (INF, 100)]
    assert bucket_quantile(buckets, 50) == (0.0005, 0.001)
    assert bucket_quantile(buckets, 98) == (0.001, 0.002)
    assert bucket_quantile(buckets, 99) == (0.002, 0.005)  # rank 99 lies past 98
    assert bucket_quantile(list(reversed(buckets)), 99) == (0.002, 0.005)  # order does not matter


def test_bucket_quantile_past_the_last_finite_bound_and_empty():
    assert bucket_quantile([(0.001, 1), (1.0, 98), (INF, 100)], 99) == (1.0, INF)
    assert all(math.isnan(x) for x in bucket_quantile([(0.001, 0), (INF, 0)], 99))
    assert all(math.isnan(x) for x in bucket_quantile([], 99))


def test_spool_counters_subtract_bucket_by_bucket():
    before = SpoolCounters(10, 0.01, ((0.001, 8), (INF, 10)), 50)
    after = SpoolCounters(30, 0.05, ((0.001, 20), (INF, 30)), 170)
    assert after - before == SpoolCounters(20, pytest.approx(0.04), ((0.001, 12), (INF, 20)), 120)


def test_spool_cost_per_turn_per_event_and_per_commit():
    delta = SpoolCounters(commits=200, seconds=0.3, buckets=((0.001, 150), (0.002, 197), (0.005, 200), (INF, 200)), drained=1000)
    cost = spool_cost(delta, turns=400, events=1000)
    assert cost["fsyncs_per_turn"] == 0.5
    assert cost["fsyncs_per_event"] == 0.2
    assert cost["events_per_commit"] == 5
    assert cost["commit_us_mean"] == pytest.approx(1500)
    assert cost["commit_us_per_turn"] == pytest.approx(750)
    assert (cost["commit_p99_us_lower"], cost["commit_p99_us_upper"]) == (2000, 5000)


def test_spool_cost_of_an_idle_phase_is_nan_not_an_error():
    cost = spool_cost(SpoolCounters(0, 0.0, ((INF, 0),), 0), turns=0, events=0)
    assert math.isnan(cost["fsyncs_per_turn"]) and math.isnan(cost["commit_us_mean"]) and math.isnan(cost["commit_p99_us_upper"])


def test_spool_counters_read_this_process_registry():
    from turnlog.metrics import SPOOL_COMMIT_SECONDS

    before = spool_counters()
    SPOOL_COMMIT_SECONDS.observe(0.0015)
    delta = spool_counters() - before
    assert delta.commits == 1 and delta.seconds == pytest.approx(0.0015)
    assert dict(delta.buckets)[0.001] == 0 and dict(delta.buckets)[0.002] == 1 and dict(delta.buckets)[INF] == 1


def test_resume_summary_counts_failures_against_the_percentiles():
    ok = resume_summary([100.0 + i for i in range(40)])
    assert (ok["samples"], ok["failed"], ok["p50_ms"], ok["p99_ms"], ok["max_ms"]) == (40, 0, 119.0, 139.0, 139.0)
    assert ok["goal_met"]
    failed = resume_summary([100.0] * 39 + [INF])
    assert failed["failed"] == 1 and failed["p99_ms"] == INF and failed["mean_ms"] == 100.0
    assert not failed["goal_met"]
    assert not resume_summary([100.0] * 40, stale=1)["goal_met"]  # a stale grant fails the goal whatever its speed
    assert not resume_summary([])["goal_met"]


def test_a_stopped_load_wakes_from_a_long_silence_and_ends():
    async def scenario() -> tuple[bool, float, bool]:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.1, stop.set)
        began = time.monotonic()
        woke = await _sleep_until(began + 30, began + 60, stop)  # a 30 s silence in the transcript
        unstopped = await _sleep_until(time.monotonic() + 0.01, time.monotonic() + 60, asyncio.Event())
        return woke, time.monotonic() - began, unstopped

    woke, waited, unstopped = asyncio.run(scenario())
    assert not woke and waited < 2
    assert unstopped


def test_lag_stats_split_the_lag_between_sequencer_and_sink():
    # events_end, sequenced, transcript_end, stored: sequencer 100 + 10 * t behind, sink 20 behind
    samples = [Sample(t, 1000 + 100 * t, 900 - 10 * t, 800, 780) for t in range(10)]
    stats = lag_stats(samples, rate=500)
    assert stats["samples"] == 10
    assert stats["sequencer_records"]["mean"] == pytest.approx(100 + 110 * 4.5)
    assert stats["sink_records"] == {"mean": 20, "p50": 20, "p99": 20, "max": 20}
    assert stats["records"]["max"] == 100 + 110 * 9 + 20
    assert stats["mean_seconds"] == pytest.approx(stats["records"]["mean"] / 500)
    empty = lag_stats([], rate=500)
    assert empty["samples"] == 0 and math.isnan(empty["records"]["mean"]) and math.isnan(empty["mean_seconds"])
