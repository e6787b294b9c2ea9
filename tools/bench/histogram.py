"""The sink's own turn-to-store histogram beside the bench's measurement of the same turns.

The bench measures turn-to-store itself (``probes.turn_latencies_ms``: each completed turn's
``emitted_at`` to its row's commit timestamp in Postgres). The sink observes the same span in
``turnlog_sink_turn_to_store_seconds`` (``emitted_at`` to just after its batch's commit, on its
own clock). :func:`compare` reads the histogram's p50 and p99 as Prometheus's
``histogram_quantile`` does (linear interpolation inside the bucket the rank falls in) and says
whether the bench's own p50 and p99 fall in the same bucket: a histogram can say no more.
"""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Buckets", "TURN_TO_STORE", "scrape_buckets", "parse_buckets", "histogram_quantile", "compare"]

TURN_TO_STORE = "turnlog_sink_turn_to_store_seconds"


@dataclass(frozen=True, slots=True)
class Buckets:
    """A histogram's cumulative buckets: ``(upper bound in seconds, observations <= it)``, by
    bound, the last one ``+Inf`` (its count is the histogram's count)."""

    bounds: tuple[tuple[float, float], ...]

    def __sub__(self, other: Buckets) -> Buckets:
        before = dict(other.bounds)
        return Buckets(tuple((le, count - before.get(le, 0.0)) for le, count in self.bounds))

    @property
    def count(self) -> float:
        return self.bounds[-1][1] if self.bounds else 0.0


def parse_buckets(text: str, name: str = TURN_TO_STORE) -> Buckets:
    """The buckets of histogram ``name`` (no labels) in a ``/metrics`` text; empty if absent."""
    found: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                found[float(sample.labels["le"])] = sample.value
    return Buckets(tuple(sorted(found.items())))


def scrape_buckets(metrics_port: int, name: str = TURN_TO_STORE) -> Buckets:
    """:func:`parse_buckets` of ``http://127.0.0.1:<metrics_port>/metrics`` (a sink started with
    ``TURNLOG_METRICS_PORT``).

    Raises:
        OSError: the port does not answer.
    """
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return parse_buckets(text, name)


def histogram_quantile(q: float, buckets: Buckets) -> float:
    """The ``q`` quantile (0..1) as Prometheus's ``histogram_quantile`` computes it: the bucket the
    rank ``q * count`` falls in, interpolated linearly between its lower and upper bounds (the
    first bucket's lower bound is 0); in the ``+Inf`` bucket, the highest finite bound. NaN
    without observations."""
    total = buckets.count
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for le, cumulative in buckets.bounds:
        if cumulative >= rank:
            if math.isinf(le):
                return lower
            inside = cumulative - below
            return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = le, cumulative
    return lower


def bucket_of(seconds: float, buckets: Buckets) -> tuple[float, float]:
    """``(lower, upper)`` bounds (seconds) of the bucket ``seconds`` falls in: lower < seconds <= upper."""
    lower = 0.0
    for le, _ in buckets.bounds:
        if seconds <= le:
            return lower, le
        lower = le
    return lower, math.inf


def compare(buckets: Buckets, own_ms: dict[str, float]) -> dict[str, Any]:
    """The histogram's p50/p99 (ms, interpolated) beside the bench's own (``own_ms``:
    ``{"p50_ms": ..., "p99_ms": ...}``), the bucket each falls in (ms) and whether it is the same."""
    out: dict[str, Any] = {"turns_observed": buckets.count}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        estimate = histogram_quantile(q, buckets)
        own = own_ms.get(f"{name}_ms", math.nan)
        hist_bucket = bucket_of(estimate, buckets) if not math.isnan(estimate) else (math.nan, math.nan)
        own_bucket = bucket_of(own / 1000.0, buckets) if not math.isnan(own) else (math.nan, math.nan)
        out[name] = {
            "histogram_ms": estimate * 1000.0,
            "bench_ms": own,
            "histogram_bucket_ms": [b * 1000.0 for b in hist_bucket],
            "bench_bucket_ms": [b * 1000.0 for b in own_bucket],
            "same_bucket": hist_bucket == own_bucket,
        }
    return out


def summary(figures: dict[str, Any]) -> str:
    """One line for the console: each quantile, histogram vs bench, and whether the buckets agree."""
    parts = []
    for name in ("p50", "p99"):
        f = figures[name]
        low, high = f["histogram_bucket_ms"]
        parts.append(f"{name} histogram {f['histogram_ms']:.1f} ms vs bench {f['bench_ms']:.1f} ms"
                     f" (bucket {low:g}-{high:g} ms: {'same' if f['same_bucket'] else 'DIFFERENT'})")
    return f"sink's turn-to-store histogram ({figures['turns_observed']:.0f} turns): " + "; ".join(parts)
