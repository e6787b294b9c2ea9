"""The ratios of a report: each figure of the pipeline over its baseline of the same run.

:func:`report_ratios` is the report's ``ratios``, computed once every phase has run;
:func:`peer_ratios` (part of it) takes what it finds and gives NaN for what is missing.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["report_ratios", "peer_ratios"]


def report_ratios(report: dict[str, Any]) -> dict[str, Any]:
    """The report's ``ratios``: the spool against Postgres's and the sink's commits, resumes under load
    against idle ones, sustained against the ceiling and each baseline, and :func:`peer_ratios`.
    Reads the baselines, sustained, latency and resume figures, so it comes after every phase."""
    b = report["baselines"]
    ceiling = min(b["K"]["events_per_second"] / 2, b["S"]["events_per_second"], b["P_best"]["events_per_second"])
    sustained = report["sustained"]
    lat50 = report["latency"]["50%"]
    spool = sustained["spool"]
    p_best = next(m for m in b["P"] if m["method"] == b["P_best"]["method"])
    sink_batch_us = sustained["sink_batch_seconds"] / max(sustained["sink_batches"], 1) * 1e6
    return {
        # The recorder's spool against Postgres's commits, in the same phase (sustained) or run (P).
        "spool_fsyncs_per_turn_over_wal_syncs_per_turn": spool["fsyncs_per_turn"]
        / max(sustained["wal_syncs_per_turn"], 1e-9),
        "spool_fsyncs_per_turn_over_sink_commits_per_turn": spool["fsyncs_per_turn"]
        / max(sustained["sink_commits_per_turn"], 1e-9),
        "spool_commit_mean_over_P_commit_mean": spool["commit_us_mean"]
        / max(p_best.get("mean_commit_ms", float("nan")) * 1000, 1e-9),
        "spool_commit_mean_over_sink_batch_mean": spool["commit_us_mean"] / max(sink_batch_us, 1e-9),
        "spool_commit_us_per_turn_over_sink_batch_us_per_turn": spool["commit_us_per_turn"]
        / max(sustained["sink_batch_seconds"] / max(sustained["turns"], 1) * 1e6, 1e-9),
        "sink_batch_us_mean": sink_batch_us,
        # resume() at 50 % load against the same run's idle resumes, per path.
        **{
            f"resume_{name}_{q}_over_idle": report["resume"][name][f"{q}_ms"]
            / max(report["resume"]["idle"][name][f"{q}_ms"], 1e-9)
            for name in ("store", "api")
            if name in report.get("resume", {}) and name in report["resume"].get("idle", {})
            for q in ("p50", "p99")
        },
        "P_best_commit_us_mean": p_best.get("mean_commit_ms", float("nan")) * 1000,
        "ceiling_events_per_second": ceiling,
        "sustained_over_ceiling": sustained["events_per_second"] / ceiling,
        "sustained_over_K": sustained["events_per_second"] / b["K"]["events_per_second"],
        "sustained_over_S": sustained["events_per_second"] / b["S"]["events_per_second"],
        "sustained_over_P": sustained["events_per_second"] / b["P_best"]["events_per_second"],
        "p99_at_50_over_K_p99": lat50["p99_ms"] / max(b["K"]["p99_ms"], 1e-9),
        "sink_commits_per_turn_times_b": sustained["sink_commits_per_turn"] * sustained["mean_batch_turns"],
        "write_transactions_per_turn_over_unsafe": sustained["write_transactions_per_turn"]
        / (b["unsafe"]["commits_per_session"] / max(b["unsafe"]["rows_per_session"] - 1, 1)),
        **peer_ratios(report),
    }


def _over(numerator: Any, denominator: Any) -> float:
    """``numerator / denominator``; NaN when either is missing or the denominator is 0 or NaN."""
    if numerator is None or denominator is None or denominator == 0 or math.isnan(denominator):
        return float("nan")
    return numerator / denominator


def peer_ratios(report: dict[str, Any]) -> dict[str, float]:
    """The issue's ratios against baselines of the same run: sustained / S0; at the 50 %
    session count, turnlog's acknowledged (``complete_turn``) and stored turn p99 over
    the direct peer's commit p99, and turnlog's write transactions per turn over the
    direct peer's (both from Postgres's transaction ids); sustained over the direct
    peer's sustained. A figure that is missing gives NaN."""
    b, s = report.get("baselines", {}), report.get("sustained", {})
    lat50, direct = report.get("latency", {}).get("50%", {}), report.get("direct", {})
    d50, dsus = direct.get("at_50", {}), direct.get("sustained", {})
    return {
        "sustained_over_S0": _over(s.get("events_per_second"), b.get("S0", {}).get("events_per_second")),
        "S_over_S0": _over(b.get("S", {}).get("events_per_second"), b.get("S0", {}).get("events_per_second")),
        "ack_p99_at_50_over_direct_commit_p99": _over(lat50.get("complete_turn_p99_ms"), d50.get("commit_p99_ms")),
        "turn_to_store_p99_at_50_over_direct_commit_p99": _over(lat50.get("p99_ms"), d50.get("commit_p99_ms")),
        "write_transactions_per_turn_at_50_over_direct": _over(lat50.get("write_transactions_per_turn"),
                                                               d50.get("write_transactions_per_turn")),
        "sink_commits_per_turn_at_50_over_direct": _over(lat50.get("sink_commits_per_turn"),
                                                         d50.get("transactions_per_turn")),
        "sustained_over_direct_sustained": _over(s.get("events_per_second"), dsus.get("committed_events_per_second")),
    }
