"""The benchmark's pure parts: workload, rate control, percentiles, lag slope, profile
summary, histogram bucket bounds, spool cost, resume summary, S0's batch rate, CPU per
event, the direct peer's statements and summary, the ratios against the peers, quick mode."""

import asyncio
import math
import re
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from turnlog.schemas import SessionEnded, SessionStarted, TurnCompleted, decode_event
from turnlog.schemas.session_keys import session_key
from turnlog.tools.bench.baselines import batch_rate, percentile
from turnlog.tools.bench.direct import (
    EVENT_SQL,
    TURN_SQL,
    DirectResult,
    direct_summary,
    lateness_flat,
    least_squares_slope,
)
from turnlog.tools.bench.load import _sleep_until, plans_for_rate
from turnlog.tools.bench.options import BenchOptions, quick_options
from turnlog.tools.bench.pipeline_phases import _lag_slope
from turnlog.tools.bench.probes import (
    Sample,
    SinkBatches,
    SpoolCounters,
    bucket_quantile,
    cpu_seconds,
    cpu_us_per_event,
    lag_stats,
    parse_sink_batches,
    spool_cost,
    spool_counters,
)
from turnlog.tools.bench.profile import summarize
from turnlog.tools.bench.ratios import peer_ratios
from turnlog.tools.bench.resume_probe import resume_summary
from turnlog.tools.bench.workload import BENCH_FLEET, encoded_events, events_per_second, plan_sessions, replayed_keys

SESSIONS = Path(__file__).resolve().parents[2] / "data" / "sessions"


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
    assert set(by_session) == {p.key for p in plans}  # as the recorder sends them: under their keys
    for plan in plans:
        got = by_session[plan.key]
        assert [e.seq for e in got] == list(range(len(got)))
        assert isinstance(got[0], SessionStarted) and isinstance(got[-1], SessionEnded)
        completed = [e for e in got if isinstance(e, TurnCompleted)]
        assert [c.text for c in completed] == [t.text for t in plan.turns]


def _like(value: str, pattern: str) -> bool:
    """SQL's ``value LIKE pattern`` (no escapes)."""
    return re.fullmatch("".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern), value,
                        re.DOTALL) is not None


def test_a_phase_finds_the_keys_of_its_own_replays_only(plans):
    plan = plans[3]
    key = session_key(BENCH_FLEET, plan.replay_id("l50", 2))  # what the recorder writes the replay under
    assert plan.key == f"{BENCH_FLEET}:{plan.session_id}" and key.startswith(plan.key)
    assert _like(key, replayed_keys("t", "l50") + "%")
    assert not _like(key, replayed_keys("t", "l5") + "%")  # another phase
    assert not _like(key, replayed_keys("u", "l50") + "%")  # another run
    assert not _like(plan.replay_id("l50", 2), replayed_keys("t", "l50") + "%")  # a bare id is not its key


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
        "main (turnlog/cli.py:1);apply (sinks/base.py:10) 30\n"
        "main (turnlog/cli.py:1);execute (psycopg/cursor.py:5) 60\n"
        "main (turnlog/cli.py:1);select (selectors.py:9) 10\n"
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


def test_sink_batches_are_read_from_the_exposition_text_as_the_sink_serves_it():
    """The sink's metrics as prometheus_client writes them (HELP, TYPE, buckets, _created
    lines, other outcomes), parsed by prometheus_client's parser."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    registry = CollectorRegistry()
    records = Counter("turnlog_sink_records_total", "records", ["outcome"], registry=registry)
    seconds = Histogram("turnlog_sink_batch_seconds", "batches", registry=registry)
    records.labels("applied").inc(120)
    records.labels("stale").inc(7)
    for took in (0.25, 0.5, 0.75):
        seconds.observe(took)
    batches = parse_sink_batches(generate_latest(registry).decode())
    assert (batches.batches, batches.records, batches.seconds) == (3, 120, 1.5)
    assert parse_sink_batches('# TYPE other_total counter\nother_total{outcome="applied"} 5\n') == SinkBatches(0.0, 0.0, 0.0)


def test_produce_all_serves_reports_while_the_queue_is_full_and_keeps_the_order(monkeypatch):
    from turnlog.settings import TurnlogSettings
    from turnlog.tools.bench import baselines

    class QueueFullTwice:
        def __init__(self):
            self.tries, self.taken, self.polls = 0, [], []

        def produce(self, topic, key, value, partition):
            self.tries += 1
            if self.tries in (2, 3):  # the second record finds the queue full twice
                raise BufferError("Local: Queue full")
            self.taken.append(value)

        def poll(self, timeout):
            self.polls.append(timeout)

        def flush(self, timeout):
            return 0

    stub = QueueFullTwice()
    monkeypatch.setattr(baselines.kafka, "producer", lambda *args, **kwargs: stub)
    events = [(f"s{i}", f"v{i}".encode()) for i in range(3)]
    baselines.produce_all(TurnlogSettings(), "t.in", events)
    assert stub.taken == [b"v0", b"v1", b"v2"] and stub.tries == 5
    assert 0.05 in stub.polls  # the wait served delivery reports; it did not sleep


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


def test_s0_rate_leaves_out_the_first_batch_and_is_nan_for_one_batch():
    assert batch_rate(11_000, 1_000, 2.0) == 5_000
    assert math.isnan(batch_rate(1_000, 1_000, 0.0))
    assert math.isnan(batch_rate(5_000, 1_000, 0.0))


def test_cpu_per_event_per_service_and_for_the_pipeline():
    before = {"sequencer": 10.0, "sink": 5.0, "finalizer": 2.0}
    after = {"sequencer": 13.0, "sink": 6.5, "finalizer": 2.5}
    cpu = cpu_us_per_event(before, after, 10_000, seconds=5.0)
    assert cpu["us_per_event"] == pytest.approx({"sequencer": 300, "sink": 150, "finalizer": 50})
    assert cpu["pipeline_us_per_event"] == pytest.approx(500)
    assert cpu["cores"] == pytest.approx({"sequencer": 0.6, "sink": 0.3, "finalizer": 0.1})
    idle = cpu_us_per_event(before, after, 0, seconds=5.0)
    assert math.isnan(idle["pipeline_us_per_event"]) and math.isnan(idle["us_per_event"]["sink"])


def test_cpu_seconds_reads_this_process():
    import os

    assert cpu_seconds(os.getpid()) >= 0


def test_the_direct_peer_uses_the_sinks_guards():
    # A higher epoch replaces an event at the same seq; an equal one changes nothing.
    assert "ON CONFLICT (session_id, seq) DO UPDATE" in EVENT_SQL and "WHERE EXCLUDED.epoch > session_events.epoch" in EVENT_SQL
    # A turn is replaced only by a newer (epoch, seq), and never a completed turn by a partial.
    assert "ON CONFLICT (session_id, turn_index) DO UPDATE" in TURN_SQL
    assert "EXCLUDED.seq > transcript_turns.seq" in TURN_SQL and "EXCLUDED.status <> 'partial'" in TURN_SQL
    assert "session_id = EXCLUDED.session_id" not in TURN_SQL  # the key is not rewritten


def test_least_squares_slope_and_the_flat_rule():
    assert least_squares_slope([(t, 0.5 + 0.1 * t) for t in range(10)]) == pytest.approx(0.1)
    assert least_squares_slope([(0, 1.0), (1, 2.0)]) == 0.0  # too few points
    assert least_squares_slope([(1, 1.0), (1, 2.0), (1, 3.0)]) == 0.0  # no spread in x
    assert lateness_flat(0.01) and lateness_flat(-0.5) and not lateness_flat(0.1)


def test_direct_summary_rates_and_lateness_over_the_window():
    result = DirectResult(seconds=10.0, events=300, turns=100, transactions=300, sessions=["p-0-d-0", "p-0-d-1", "p-1-d-0"])
    result.commit_ms = [float(i) for i in range(1, 101)]
    result.write_ms = [1.0] * 300
    result.committed_at = [i / 30 for i in range(300)]  # 30 commits a second over 10 s
    keeping_up = [(i / 30, 0.002) for i in range(300)]
    falling_behind = [(i / 30, 0.5 * i / 30) for i in range(300)]
    summary = direct_summary(DirectResult(**{**_fields(result), "lateness": keeping_up}), (3.0, 9.0))
    assert summary["sessions"] == 2  # rounds of one plan count once
    assert summary["committed_events_per_second"] == pytest.approx(30, rel=0.02)
    assert summary["transactions_per_turn"] == 3 and summary["events_per_second"] == 30
    assert (summary["commit_p50_ms"], summary["commit_p99_ms"]) == (50.0, 99.0)
    assert summary["flat"] and summary["lateness_p99_ms"] == pytest.approx(2)
    behind = direct_summary(DirectResult(**{**_fields(result), "lateness": falling_behind}), (3.0, 9.0))
    assert behind["lateness_slope"] == pytest.approx(0.5) and not behind["flat"]
    empty = direct_summary(DirectResult(), (3.0, 9.0))
    assert math.isnan(empty["transactions_per_turn"]) and math.isnan(empty["commit_p99_ms"]) and empty["flat"]


def _fields(result: DirectResult) -> dict:
    return {name: getattr(result, name) for name in DirectResult.__slots__}


def test_peer_ratios_against_s0_and_the_direct_peer():
    report = {
        "baselines": {"S0": {"events_per_second": 5000.0}, "S": {"events_per_second": 2000.0}},
        "sustained": {"events_per_second": 2500.0},
        "latency": {"50%": {"complete_turn_p99_ms": 30.0, "p99_ms": 90.0, "write_transactions_per_turn": 0.2, "sink_commits_per_turn": 0.1}},
        "direct": {"at_50": {"commit_p99_ms": 20.0, "write_transactions_per_turn": 2.5, "transactions_per_turn": 2.5},
                   "sustained": {"committed_events_per_second": 5000.0}},
    }
    r = peer_ratios(report)
    assert r["sustained_over_S0"] == 0.5 and r["S_over_S0"] == 0.4
    assert r["ack_p99_at_50_over_direct_commit_p99"] == 1.5 and r["turn_to_store_p99_at_50_over_direct_commit_p99"] == 4.5
    assert r["write_transactions_per_turn_at_50_over_direct"] == pytest.approx(0.08)
    assert r["sink_commits_per_turn_at_50_over_direct"] == pytest.approx(0.04)
    assert r["sustained_over_direct_sustained"] == 0.5
    # A phase that failed or was skipped leaves NaN, not an error.
    missing = peer_ratios({"baselines": {"S": {"events_per_second": 2000.0}}, "sustained": {"events_per_second": 2500.0},
                           "direct": {"error": "RuntimeError: x"}})
    assert all(math.isnan(v) for v in missing.values())


def test_quick_mode_shortens_every_phase_and_keeps_the_rest():
    full = BenchOptions(sessions_dir=Path("s"), admin_url=SecretStr("postgresql://x"), sessions=700, direct_connections=8)
    quick = quick_options(full)
    assert quick.phase_seconds < full.phase_seconds and quick.turns_per_session <= 10
    assert quick.memory_sessions < full.memory_sessions and quick.resume_samples < full.resume_samples
    assert quick.resume_seconds < full.resume_seconds
    assert (quick.sessions, quick.direct_connections, quick.admin_url.get_secret_value()) == (700, 8, "postgresql://x")


def test_a_plot_or_profile_without_the_bench_extra_is_refused_before_any_work(monkeypatch, tmp_path):
    import sys

    from turnlog.exceptions import ConfigurationError
    from turnlog.settings import TurnlogSettings
    from turnlog.tools.bench import runner

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: find_spec answers None
    options = BenchOptions(sessions_dir=tmp_path, admin_url=SecretStr("postgresql+psycopg://nobody@127.0.0.1:1/none"),
                                  plot_path=tmp_path / "bench.png", log_dir=tmp_path / "logs")
    with pytest.raises(ConfigurationError, match="--plot needs matplotlib"):
        runner.run_bench(TurnlogSettings(), options)
    monkeypatch.setattr(runner.shutil, "which", lambda name: None)
    with pytest.raises(ConfigurationError, match="--profile-dir needs py-spy"):
        runner.require_extras(BenchOptions(sessions_dir=tmp_path, admin_url=SecretStr("x"), profile_dir=tmp_path))
    assert not (tmp_path / "logs").exists()  # nothing was started
