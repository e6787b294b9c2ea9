"""The transactions phase's pure parts (tools/bench/transactions.py): the order of its variants,
pooling the runs of a mode, the on/off ratios, its table rows; and the drained check that
looks past the transcript's transaction markers (tools/bench/probes.py); a variant's settings."""

import math

import pytest

from turnlog.tools.bench.probes import Sample, pipeline_drained
from turnlog.tools.bench.table import transactions_rows
from turnlog.tools.bench.transactions import on_over_off, pool_runs, variant_order
from turnlog.tools.bench.variants import moderate_on_off


def _run(on: bool, *, cap_events: int, cap_seconds: float, cap_sequencer: float, samples: list[float],
         mod_sequencer: float, transactions: int = 0, broker: float | None = None) -> dict:
    def phase(events: int, seconds: float, sequencer: float, extra: dict) -> dict:
        cpu = {"sequencer": sequencer, "sink": 1.0, "finalizer": 0.0, **extra}
        return {"events": events, "seconds": seconds, "records": events, "transactions": transactions, "cpu_seconds": cpu}

    capacity = phase(cap_events, cap_seconds, cap_sequencer, {} if broker is None else {"broker": broker})
    moderate = phase(1_000, 10.0, mod_sequencer, {"generator": 0.5, **({} if broker is None else {"broker": broker})})
    moderate.update(samples_ms=samples, complete_ms=[5.0, 7.0], load_seconds=8.0)
    return {"transactions": on, "capacity": capacity, "moderate": moderate}


def test_variants_alternate_so_a_drift_falls_on_both_modes():
    assert variant_order(1) == [False, True]
    assert variant_order(3) == [False, True, True, False, False, True]
    assert variant_order(0) == []
    for n in range(1, 5):
        order = variant_order(n)
        assert order.count(True) == order.count(False) == n


def test_runs_of_a_mode_are_pooled_over_events_and_seconds():
    runs = [
        _run(True, cap_events=10_000, cap_seconds=4.0, cap_sequencer=1.0, samples=[10.0, 20.0], mod_sequencer=0.3,
             transactions=100, broker=0.2),
        _run(True, cap_events=30_000, cap_seconds=6.0, cap_sequencer=3.0, samples=[30.0, 40.0], mod_sequencer=0.5,
             transactions=300),
    ]
    pooled = pool_runs(runs)
    assert pooled["runs"] == 2
    assert pooled["capacity_events_per_second"] == pytest.approx(40_000 / 10.0)
    assert pooled["capacity_sequencer_us_per_event"] == pytest.approx(4.0 / 40_000 * 1e6)  # 100 µs
    assert pooled["capacity_pipeline_us_per_event"] == pytest.approx((4.0 + 2.0) / 40_000 * 1e6)
    assert "capacity_broker_us_per_event" not in pooled  # one run did not measure it
    assert "capacity_generator_us_per_event" not in pooled  # the generator is idle while draining
    assert pooled["moderate_offered_events_per_second"] == pytest.approx(2_000 / 16.0)  # over the loads alone
    # Every process both runs measured: the broker (one run only) is not in it.
    assert pooled["moderate_measured_us_per_event"] == pytest.approx((0.8 + 2.0 + 0.0 + 1.0) / 2_000 * 1e6)
    assert pooled["moderate_sequencer_us_per_event"] == pytest.approx(0.8 / 2_000 * 1e6)
    assert pooled["moderate_generator_us_per_event"] == pytest.approx(1.0 / 2_000 * 1e6)
    assert (pooled["moderate_p50_ms"], pooled["moderate_p99_ms"]) == (20.0, 40.0)  # over every run's turns
    assert pooled["moderate_turns"] == 4 and pooled["moderate_complete_turn_p99_ms"] == 7.0
    assert pooled["capacity_events_per_transaction"] == pytest.approx(100.0)


def test_on_over_off_divides_each_figure_and_is_nan_where_off_has_none():
    on = pool_runs([_run(True, cap_events=10_000, cap_seconds=5.0, cap_sequencer=1.5, samples=[30.0],
                         mod_sequencer=0.4, transactions=50)])
    off = pool_runs([_run(False, cap_events=10_000, cap_seconds=4.0, cap_sequencer=1.0, samples=[20.0],
                          mod_sequencer=0.2)])
    r = on_over_off(on, off)
    assert r["capacity_events_per_second"] == pytest.approx(0.8)
    assert r["capacity_sequencer_us_per_event"] == pytest.approx(1.5)
    assert r["moderate_sequencer_us_per_event"] == pytest.approx(2.0)
    assert r["moderate_p99_ms"] == pytest.approx(1.5)
    assert math.isnan(off["capacity_events_per_transaction"])  # no transactions off
    assert math.isnan(r["capacity_events_per_transaction"])
    assert "runs" not in r
    assert math.isnan(on_over_off({"x": 1.0}, {})["x"]) and math.isnan(on_over_off({"x": 1.0}, {"x": 0})["x"])


def test_the_table_shows_off_to_on_with_the_ratio_or_the_error():
    on = pool_runs([_run(True, cap_events=10_000, cap_seconds=5.0, cap_sequencer=1.5, samples=[30.0],
                         mod_sequencer=0.4, transactions=50)])
    off = pool_runs([_run(False, cap_events=10_000, cap_seconds=4.0, cap_sequencer=1.0, samples=[20.0],
                          mod_sequencer=0.2)])
    report = {"transactions": {"repetitions": 1, "backlog_events": 10_000, "on": on, "off": off,
                               "on_over_off": on_over_off(on, off)}}
    rows = transactions_rows(report)
    assert [name for name, _, _ in rows] == ["transactions off -> on: capacity",
                                             "transactions off -> on: at 125 ev/s"]
    assert rows[0][1] == "2,500 -> 2,000 ev/s (0.80 x)"
    assert "sequencer 100 -> 150 µs (1.50 x)" in rows[0][2]
    assert rows[1][1] == "p99 20.0 -> 30.0 ms (1.50 x)"
    assert "sequencer 200 -> 400 µs (2.00 x)" in rows[1][2]
    assert transactions_rows({"transactions": {"error": "RuntimeError: x"}}) == [
        ("sequencer transactions on vs off", "not measured", "RuntimeError: x")]
    assert transactions_rows({}) == []


def test_drained_looks_past_the_transaction_markers_once_the_sequencer_is_done():
    def never() -> int:
        raise AssertionError("record ends read while the sequencer still had events")

    behind = Sample(0.0, events_end=100, sequenced=90, transcript_end=95, stored=95)
    assert not pipeline_drained(behind, never) and not pipeline_drained(None, never)
    exact = Sample(0.0, events_end=100, sequenced=100, transcript_end=100, stored=100)
    assert pipeline_drained(exact, never)  # no markers (transactions off): the watermarks tell
    markers = Sample(0.0, events_end=100, sequenced=100, transcript_end=112, stored=100)
    assert pipeline_drained(markers, lambda: 100)  # the 12 offsets past the sink's are markers
    assert not pipeline_drained(markers, lambda: 104)  # 4 records not yet stored


def test_a_settings_copy_with_another_prefix_names_its_own_topics_even_after_the_original_was_read():
    from turnlog.settings import TurnlogSettings

    run = TurnlogSettings(topic_prefix="bench-r")
    assert run.topics.events == "bench-r.events"
    variant = run.model_copy(update={"topic_prefix": "bench-r-tx0off", "sequencer_transactions": False})
    assert variant.topics.events == "bench-r-tx0off.events" and variant.topics.transcript == "bench-r-tx0off.transcript"
    assert variant.as_environment()["TURNLOG_SEQUENCER_TRANSACTIONS"] == "False"
    assert run.topics.events == "bench-r.events"


def test_moderate_on_off_pools_each_mode_pairs_each_repetition_and_leaves_capacity_out():
    def moderate_only(on: bool, mod_sequencer: float, samples: list[float]) -> dict:
        run = _run(on, cap_events=1, cap_seconds=1.0, cap_sequencer=0.0, samples=samples, mod_sequencer=mod_sequencer)
        del run["capacity"]  # the on/off variants of the tracing and encryption phases drain no backlog
        return run

    runs = [moderate_only(False, 0.2, [10.0]), moderate_only(True, 0.4, [30.0]),
            moderate_only(True, 0.6, [50.0]), moderate_only(False, 0.2, [20.0])]
    figures = moderate_on_off(runs, is_on=lambda run: run["transactions"])
    assert not any(key.startswith("capacity_") for mode in ("on", "off") for key in figures[mode])
    assert figures["on"]["moderate_sequencer_us_per_event"] == pytest.approx(1.0 / 2_000 * 1e6)
    assert figures["off"]["moderate_sequencer_us_per_event"] == pytest.approx(0.4 / 2_000 * 1e6)
    assert figures["on_over_off"]["moderate_sequencer_us_per_event"] == pytest.approx(2.5)
    # The n-th on run against the n-th off run, in run order.
    assert [pair["moderate_sequencer_us_per_event"] for pair in figures["pairs"]] == pytest.approx([2.0, 3.0])
    with pytest.raises(ValueError):
        moderate_on_off(runs[:3], is_on=lambda run: run["transactions"])
