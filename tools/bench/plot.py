"""The benchmark's PNG: durable throughput and lag over the run, and the latency distributions."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

__all__ = ["plot_report"]


def plot_report(report: dict[str, Any], path: Path) -> None:
    """Write ``path``: top, durable events/s and lag over time; bottom, turn-to-durable latency CDFs.

    Raises:
        RuntimeError: matplotlib is not installed (``pip install 'turnlog[bench]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("the plot needs matplotlib: pip install 'turnlog[bench]'") from e
    timeline = report["timeline"]
    t0 = timeline[0]["at"] if timeline else 0.0
    times, rates, lags = [], [], []
    for before, after in pairwise(timeline):
        span = after["at"] - before["at"]
        if span <= 0:
            continue
        times.append(after["at"] - t0)
        rates.append((after["stored"] - before["stored"]) / span)
        lags.append((after["events_end"] - after["sequenced"]) + (after["transcript_end"] - after["stored"]))
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8))
    top.plot(times, rates, color="tab:blue", linewidth=1, label="durable events/s (sink)")
    top.set_xlabel("seconds since the capacity phase began")
    top.set_ylabel("events/s stored")
    lag_axis = top.twinx()
    lag_axis.plot(times, lags, color="tab:red", linewidth=1, alpha=0.6, label="lag (records)")
    lag_axis.set_ylabel("lag (records)")
    top.set_title(f"turnlog bench {report['run_id']}: throughput over time (sustained"
                  f" {report['sustained']['events_per_second']:,.0f} events/s)")
    top.legend(loc="upper left")
    lag_axis.legend(loc="upper right")
    for label, figures in report["latency"].items():
        samples = sorted(figures["samples_ms"])
        if not samples:
            continue
        shares = [(i + 1) / len(samples) for i in range(len(samples))]
        bottom.plot(samples, shares, label=f"at {label} of sustained: p99 {figures['p99_ms']:.0f} ms")
    bottom.axvline(100, color="grey", linestyle="--", linewidth=1, label="target p99 100 ms")
    bottom.set_xscale("log")
    bottom.set_xlabel("turn-to-durable latency (ms, emitted_at -> commit of the row)")
    bottom.set_ylabel("share of completed turns")
    bottom.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
