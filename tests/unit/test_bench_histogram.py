"""The bench's reading of the sink's turn-to-store histogram (tools/bench/histogram.py): quantiles as
Prometheus's histogram_quantile computes them, and the bucket comparison with the bench's own figures."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from turnlog.tools.bench.histogram import Buckets, bucket_of, compare, histogram_quantile, parse_buckets

BUCKETS = Buckets(((0.1, 10.0), (0.25, 60.0), (0.5, 100.0), (math.inf, 100.0)))


def test_quantiles_interpolate_inside_the_bucket_the_rank_falls_in():
    assert histogram_quantile(0.5, BUCKETS) == pytest.approx(0.1 + 0.15 * (40 / 50))
    assert histogram_quantile(0.99, BUCKETS) == pytest.approx(0.25 + 0.25 * (39 / 40))
    assert histogram_quantile(0.05, BUCKETS) == pytest.approx(0.1 * 0.5)  # the first bucket starts at 0
    # A rank in the +Inf bucket: the highest finite bound, as Prometheus answers.
    assert histogram_quantile(0.99, Buckets(((0.1, 1.0), (math.inf, 100.0)))) == 0.1
    assert math.isnan(histogram_quantile(0.5, Buckets(((0.1, 0.0), (math.inf, 0.0)))))


def test_a_scraped_histogram_minus_an_earlier_scrape_is_the_phase_alone():
    registry = CollectorRegistry()
    histogram = Histogram("turnlog_sink_turn_to_store_seconds", "t", buckets=(0.1, 0.25, 0.5), registry=registry)
    histogram.observe(0.05)
    before = parse_buckets(generate_latest(registry).decode())
    for value in (0.2, 0.3, 0.3, 7.0):
        histogram.observe(value)
    phase = parse_buckets(generate_latest(registry).decode()) - before
    assert phase.bounds == ((0.1, 0.0), (0.25, 1.0), (0.5, 3.0), (math.inf, 4.0))
    assert phase.count == 4


def test_compare_says_whether_the_bench_figures_fall_in_the_histograms_buckets():
    figures = compare(BUCKETS, {"p50_ms": 180.0, "p99_ms": 600.0})
    assert figures["p50"]["same_bucket"] is True and figures["p50"]["bench_bucket_ms"] == [100.0, 250.0]
    assert figures["p99"]["same_bucket"] is False and figures["p99"]["bench_bucket_ms"] == [500.0, math.inf]
    assert bucket_of(0.25, BUCKETS) == (0.1, 0.25)  # an upper bound belongs to its bucket (le)
