"""The table ``turnlog bench`` prints: every figure of a report next to its baseline or target.

:func:`print_table` reads only the report (``runner.run_bench`` returns and writes it), so the table
of a checked-in report (``docs/bench/*.json``) can be printed again.
"""

from __future__ import annotations

from typing import Any

__all__ = ["print_table", "encryption_rows", "tracing_rows", "transactions_rows", "ENCRYPTION_TARGET_RATIO"]

#: Encryption on over off, for turn-to-store p99 and CPU per event at moderate load (issue 21).
ENCRYPTION_TARGET_RATIO = 1.10


def print_table(report: dict[str, Any]) -> None:
    """The figures, each next to its baseline or target, as a plain table."""
    b, s = report.get("baselines", {}), report.get("sustained", {})
    r, m = report.get("ratios", {}), report.get("memory", {})
    if not (b and s and r):  # a run of one phase (only), or one that failed before the ratios
        _print_rows(transactions_rows(report) + encryption_rows(report) + tracing_rows(report))
        return
    lat = report["latency"]
    rows = [
        ("capacity (draining a backlog)",
         f"{report.get('capacity', {}).get('events_per_second', float('nan')):,.0f} ev/s", "no generator running"),
        ("K raw Kafka produce->consume", f"{b['K']['events_per_second']:,.0f} ev/s", f"p99 {b['K']['p99_ms']:.1f} ms"),
        *([("S0 bare Faust consume-only", f"{b['S0']['events_per_second']:,.0f} rec/s",
            "take_events(1000), nothing else")] if "S0" in b else []),
        ("S bare Faust pass-through", f"{b['S']['events_per_second']:,.0f} ev/s",
         f"{r.get('S_over_S0', float('nan')):.2f} x S0" if "S0" in b else ""),
        *[(f"P psycopg {p['method']}", f"{p['rows_per_second']:,.0f} rows/s", f"p99 commit {p['p99_commit_ms']:.1f} ms")
          for p in b["P"]],
        ("P best, as events", f"{b['P_best']['events_per_second']:,.0f} ev/s",
         f"{b['P_best']['rows_per_event']:.2f} rows/event"),
        ("ceiling min(K/2, S, P)", f"{r['ceiling_events_per_second']:,.0f} ev/s", ""),
        ("sustained end-to-end (lag flat)", f"{s['events_per_second']:,.0f} ev/s",
         f"{r['sustained_over_ceiling']:.2f} x ceiling; "
         f"{r.get('sustained_over_S0', float('nan')):.2f} x S0 (target >= 0.5); "
         f"lag slope {s['lag_slope_events_per_second']:+.1f}/s"),
        *[(f"turn-to-durable at {k}", f"p50 {v['p50_ms']:.1f} / p95 {v['p95_ms']:.1f} / p99 {v['p99_ms']:.1f} ms",
           f"{v['turns']} turns at {v['offered_events_per_second']:,.0f} ev/s"
           + (f"; p99 {r['p99_at_50_over_K_p99']:.1f} x K p99 (target p99 <= 100 ms)" if k == "50%" else ""))
          for k, v in lat.items()],
        *[(f"cores used at {k}", ", ".join(f"{n} {c:.2f}" for n, c in v.get("cores_used", {}).items()),
           "of 2 (broker and Postgres not counted)")
          for k, v in lat.items()],
        ("sink commits per turn", f"{s['sink_commits_per_turn']:.3f}",
         f"1/b = {1 / max(s['mean_batch_turns'], 1e-9):.3f} "
         f"(b = {s['mean_batch_turns']:.1f} turns, {s['mean_batch_events']:.1f} events per batch); "
         f"at 50%: {lat['50%']['sink_commits_per_turn']:.3f} (target <= 1)"),
        ("all write transactions per turn", f"{s['write_transactions_per_turn']:.3f}",
         f"sink + finalizer + autovacuum, cluster-wide xids; at 50%: {lat['50%']['write_transactions_per_turn']:.3f}; "
         f"unsafe: {b['unsafe']['commits_per_session'] / max(b['unsafe']['rows_per_session'] - 1, 1):.3f}"),
        ("WAL syncs per turn", f"{s['wal_syncs_per_turn']:.3f}", f"at 50%: {lat['50%']['wal_syncs_per_turn']:.3f}"),
        *_spool_rows(report),
        *_signing_rows(report),
        *_redaction_rows(report),
        *transactions_rows(report),
        *encryption_rows(report),
        *_peer_rows(report),
        ("unsafe baseline", f"{b['unsafe']['commits_per_session']:.0f} commit/session",
         f"SIGKILL at 50%: {b['unsafe']['turns_said_at_kill']} turns said, "
         f"{b['unsafe']['turns_stored_after_kill']} stored"),
    ]
    for name in ("store", "api"):
        res = report.get("resume", {}).get(name)
        no_idle = {"p50_ms": float("nan"), "p99_ms": float("nan"), "samples": 0}
        idle = report.get("resume", {}).get("idle", {}).get(name, no_idle)
        if res:
            rows.append((f"resume() at 50%, via {name}", f"p50 {res['p50_ms']:.0f} / p99 {res['p99_ms']:.0f} ms",
                         f"{res['samples']} resumes ({res['failed']} failed, {res['stale']} stale) at "
                         f"{report['resume']['offered_events_per_second']:,.0f} ev/s offered; "
                         f"idle p50 {idle['p50_ms']:.0f} / p99 "
                         f"{idle['p99_ms']:.0f} ms over {idle['samples']} (target p99 <= {res['goal_p99_ms']:.0f} ms)"))
    resume = report.get("resume", {})
    if resume.get("lag"):
        lag = resume["lag"]
        rows.append(("lag while resuming at 50%",
                     f"mean {lag['records']['mean']:,.0f} / p99 {lag['records']['p99']:,.0f} records",
                     f"~{lag['mean_seconds']:.2f} s / {lag['p99_seconds']:.2f} s of load; "
                     f"sequencer {lag['sequencer_records']['mean']:,.0f}, "
                     f"sink {lag['sink_records']['mean']:,.0f} (means); in the latency phase at 50%: mean "
                     f"{lat.get('50%', {}).get('lag', {}).get('records', {}).get('mean', float('nan')):,.0f} records"))
        rows.append(("cores used while resuming",
                     ", ".join(f"{n} {c:.2f}" for n, c in resume.get("cores_used", {}).items()), "of 2"))
    if report.get("resume", {}).get("error"):
        rows.append(("resume() at 50%", "not measured", report["resume"]["error"]))
    if report.get("resume", {}).get("api_error"):
        rows.append(("resume() via api", "not measured", report["resume"]["api_error"]))
    if m:
        rows.append(("RSS per 1,000 open sessions", f"{m['total_mb_per_1000_sessions']:.2f} MB",
                     ", ".join(f"{k} {v:.2f} MB" for k, v in m["mb_per_1000_sessions"].items()) + " (target <= 5 MB)"))
    _print_rows(rows)
    for name, summary in report.get("profile", {}).items():
        print(f"\nprofile {name}: {summary['samples']} samples, {summary['own_code_share']:.1%} in turnlog's own code; "
              "top self time:")
        for frame, share in summary["top_self"][:8]:
            print(f"  {share:6.1%}  {frame}")


def _print_rows(rows: list[tuple[str, str, str]]) -> None:
    """``(name, value, note)`` rows as aligned columns, after a blank line; nothing for none."""
    if not rows:
        return
    width = max(len(name) for name, _, _ in rows)
    print()
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:<34} {note}")


def _spool_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Table rows of the recorder's spool cost (sustained phase, and at 50 %)."""
    s, r = report["sustained"], report.get("ratios", {})
    spool, at50 = s.get("spool"), report["latency"].get("50%", {}).get("spool")
    if not spool:
        return []
    fifty = lambda key, fmt: f"; at 50%: {format(at50[key], fmt)}" if at50 else ""  # noqa: E731
    return [
        ("spool fsyncs per turn (recorder)", f"{spool['fsyncs_per_turn']:.3f}",
         f"{spool['fsyncs_per_event']:.3f} per event ({spool['events_per_commit']:.1f} events per commit); "
         f"{r.get('spool_fsyncs_per_turn_over_wal_syncs_per_turn', float('nan')):.1f} x Postgres WAL syncs per turn"
         + fifty("fsyncs_per_turn", ".3f")),
        ("spool commit time (recorder)",
         f"{spool['commit_us_mean']:,.0f} µs/commit, {spool['commit_us_per_turn']:,.0f} µs/turn",
         f"mean; p99 in ({spool['commit_p99_us_lower']:,.0f}, {spool['commit_p99_us_upper']:,.0f}] µs "
         "(its histogram bucket); "
         f"P commit mean {r.get('P_best_commit_us_mean', float('nan')):,.0f} µs, "
         f"sink batch mean {r.get('sink_batch_us_mean', float('nan')):,.0f} µs"
         + (f"; at 50%: {at50['commit_us_mean']:,.0f} µs/commit, {at50['commit_us_per_turn']:,.0f} µs/turn"
            if at50 else "")),
    ]


def _signing_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    cost = report.get("signing")
    if not cost:
        return []
    return [("signing (fleet keys) on vs off",
             f"+{cost['added_us_per_event']:.1f} µs CPU/event",
             f"recorder +{cost['recorder_sign_us']:.1f} µs; sequencer decide {cost['sequencer_off_us']:.1f} -> "
             f"{cost['sequencer_on_us']:.1f} µs ({cost['sequencer_on_over_off']:.2f} x); "
             f"{cost['added_share_of_pipeline_cpu']:.1%} of the pipeline's CPU/event at capacity")]


def _redaction_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    cost = report.get("redaction")
    if not cost:
        return []
    return [("redaction (patterns) in the recorder",
             f"+{cost['per_event_us']:.1f} µs CPU/event",
             f"{cost['completed_us']:.1f} µs/completed turn, {cost['partial_us']:.1f} µs/partial; "
             f"{cost['per_event_over_encode_validate']:.2f} x encode+validate; "
             f"{cost['share_of_pipeline_cpu']:.1%} of the pipeline's CPU/event at capacity")]


def transactions_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Table rows of the transactions phase: each figure off -> on, and on / off."""
    tx = report.get("transactions")
    if not tx:
        return []
    if tx.get("error"):
        return [("sequencer transactions on vs off", "not measured", tx["error"])]
    on, off, r, nan = tx["on"], tx["off"], tx["on_over_off"], float("nan")

    def change(key: str, unit: str, fmt: str = ",.0f") -> str:
        return (f"{format(off.get(key, nan), fmt)} -> {format(on.get(key, nan), fmt)} {unit}"
                f" ({r.get(key, nan):.2f} x)")

    def cpu(phase: str) -> str:
        broker = (f"; broker {change(f'{phase}_broker_us_per_event', 'µs')}"
                  if f"{phase}_broker_us_per_event" in on else "")
        return (f"sequencer {change(f'{phase}_sequencer_us_per_event', 'µs')}; sink"
                f" {change(f'{phase}_sink_us_per_event', 'µs')}; pipeline"
                f" {change(f'{phase}_pipeline_us_per_event', 'µs')}{broker}; every process measured"
                f" {change(f'{phase}_measured_us_per_event', 'µs')}")

    runs = f"{tx['repetitions']} run{'s' if tx['repetitions'] > 1 else ''} per mode, pooled"
    return [
        ("transactions off -> on: capacity", change("capacity_events_per_second", "ev/s"),
         f"draining {tx['backlog_events']:,} events; CPU per event: {cpu('capacity')};"
         f" {on.get('capacity_events_per_transaction', nan):,.0f} events per transaction; {runs}"),
        (f"transactions off -> on: at {on.get('moderate_offered_events_per_second', nan):,.0f} ev/s",
         f"p99 {change('moderate_p99_ms', 'ms', '.1f')}",
         f"turn-to-store p50 {change('moderate_p50_ms', 'ms', '.1f')}, p95 {change('moderate_p95_ms', 'ms', '.1f')};"
         f" CPU per event: {cpu('moderate')}; {on.get('moderate_events_per_transaction', nan):.1f} events per"
         f" transaction; {on.get('moderate_turns', 0):,} / {off.get('moderate_turns', 0):,} turns (on / off);"
         f" complete_turn p99 {change('moderate_complete_turn_p99_ms', 'ms', '.1f')} (control)"),
    ]


def encryption_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Table rows of the encryption phase: the in-process cost per event, then the pipeline's
    turn-to-store p99 and CPU per event off -> on at moderate load, with on / off."""
    rows, nan = [], float("nan")
    cost = report.get("encryption_cost")
    if cost:
        share = cost.get("added_share_of_pipeline_cpu", nan)
        rows.append(("encryption on vs off, per event", f"+{cost['added_us_per_event']:.1f} µs CPU/event",
                     f"recorder {cost['recorder_off_us']:.1f} -> {cost['recorder_on_us']:.1f} µs"
                     f" ({cost['recorder_on_over_off']:.2f} x); reader decode+open {cost['reader_off_us']:.1f} ->"
                     f" {cost['reader_on_us']:.1f} µs; sink planning {cost['sink_plan_off_us']:.1f} ->"
                     f" {cost['sink_plan_on_us']:.1f} µs; wrap {cost['wrap_us_per_epoch']:.0f} / first unwrap"
                     f" {cost['unwrap_us_per_epoch']:.0f} µs per session epoch"
                     + ("" if share != share else f"; {share:.1%} of the pipeline's CPU/event at capacity")))
        rows.append(("encryption on vs off, bytes per event",
                     f"{cost['plain_bytes_per_event']:,.0f} -> {cost['sealed_bytes_per_event']:,.0f} B",
                     f"{cost['bytes_on_over_off']:.2f} x (the record value: base64 box and wrapped key)"))
    enc = report.get("encryption")
    if not enc:
        return rows
    if enc.get("error"):
        return [*rows, ("encryption on vs off under load", "not measured", enc["error"])]
    on, off, r = enc["on"], enc["off"], enc["on_over_off"]

    def change(key: str, unit: str, fmt: str = ",.0f") -> str:
        return (f"{format(off.get(key, nan), fmt)} -> {format(on.get(key, nan), fmt)} {unit}"
                f" ({r.get(key, nan):.2f} x)")

    runs = f"{enc['repetitions']} run{'s' if enc['repetitions'] > 1 else ''} per mode, pooled"
    rate = on.get("moderate_offered_events_per_second", nan)
    broker = f"; broker {change('moderate_broker_us_per_event', 'µs')}" if "moderate_broker_us_per_event" in on else ""
    rows += [
        (f"encryption off -> on: at {rate:,.0f} ev/s", f"p99 {change('moderate_p99_ms', 'ms', '.1f')}",
         f"turn-to-store p50 {change('moderate_p50_ms', 'ms', '.1f')}, p95 {change('moderate_p95_ms', 'ms', '.1f')};"
         f" complete_turn p99 {change('moderate_complete_turn_p99_ms', 'ms', '.1f')};"
         f" {on.get('moderate_turns', 0):,} / {off.get('moderate_turns', 0):,} turns (on / off); {runs};"
         f" target p99 on / off <= {ENCRYPTION_TARGET_RATIO:.2f}"),
        (f"encryption off -> on: CPU at {rate:,.0f} ev/s", change("moderate_measured_us_per_event", "µs/event"),
         f"every process measured (Postgres not); pipeline {change('moderate_pipeline_us_per_event', 'µs')};"
         f" sequencer {change('moderate_sequencer_us_per_event', 'µs')}; sink"
         f" {change('moderate_sink_us_per_event', 'µs')}; generator (recorder)"
         f" {change('moderate_generator_us_per_event', 'µs')}{broker}; target on / off <="
         f" {ENCRYPTION_TARGET_RATIO:.2f}"),
    ]
    return rows


def tracing_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Table rows of the tracing phase: turn-to-store and CPU per event off -> on, and on / off."""
    trc, nan = report.get("tracing"), float("nan")
    rows = []
    cost = report.get("tracing_cost")
    if cost:
        added = cost["total_on_us"] - cost["total_off_us"]
        share = ""
        if trc and trc.get("off", {}).get("moderate_measured_us_per_event"):
            measured = trc["off"]["moderate_measured_us_per_event"]
            share = (f"; {added / measured:.1%} of every measured process's CPU/event ({measured:,.0f} µs at"
                     " moderate load, tracing off)")
        rows.append(("tracing on vs off, in process", f"+{added:.1f} µs CPU/event",
                     f"recorder {cost['recorder_off_us']:.1f} -> {cost['recorder_on_us']:.1f} µs, sequencer"
                     f" {cost['sequencer_off_us']:.1f} -> {cost['sequencer_on_us']:.1f}, sink {cost['sink_off_us']:.1f}"
                     f" -> {cost['sink_on_us']:.1f} (their own code, I/O replaced: {cost['total_on_over_off']:.3f} x)"
                     + share))
    if not trc:
        return rows
    on, off, r = trc["on"], trc["off"], trc["on_over_off"]

    def change(key: str, unit: str, fmt: str = ",.0f") -> str:
        return (f"{format(off.get(key, nan), fmt)} -> {format(on.get(key, nan), fmt)} {unit}"
                f" ({r.get(key, nan):.3f} x)")

    rate = on.get("moderate_offered_events_per_second", nan)
    return [
        *rows,
        (f"tracing off -> on ({trc['sample_ratio']:.0%}): at {rate:,.0f} ev/s",
         f"p99 {change('moderate_p99_ms', 'ms', '.1f')}",
         f"turn-to-store p50 {change('moderate_p50_ms', 'ms', '.1f')}; complete_turn p99"
         f" {change('moderate_complete_turn_p99_ms', 'ms', '.1f')}; {trc['repetitions']} run(s) per mode"),
        (f"tracing off -> on: CPU at {rate:,.0f} ev/s", change("moderate_measured_us_per_event", "µs/event"),
         f"every process measured (Postgres not); pipeline {change('moderate_pipeline_us_per_event', 'µs')};"
         f" generator (recorder) {change('moderate_generator_us_per_event', 'µs')}; target on / off <= 1.05"),
    ]


def _peer_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Table rows of CPU per event at capacity and of the direct peer, with their ratios."""
    r, rows = report.get("ratios", {}), []
    nan = float("nan")
    cpu = report.get("cpu_at_capacity")
    if cpu:
        rows.append(("CPU per event at capacity", f"{cpu['pipeline_us_per_event']:,.0f} µs (pipeline)",
                     ", ".join(f"{k} {v:,.0f}" for k, v in cpu["us_per_event"].items())
                     + f" µs over {cpu['events']:,} events (target: a third of before)"))
    direct = report.get("direct", {})
    if direct.get("error"):
        rows.append(("direct peer", "not measured", direct["error"]))
    if direct.get("capacity"):
        c = direct["capacity"]
        rows.append(("direct capacity (unpaced)", f"{c['committed_events_per_second']:,.0f} ev/s",
                     f"{c['sessions']} agents on {direct['connections']} connections; "
                     f"agents' process {c['cores']:.2f} cores, "
                     f"{c['cpu_us_per_event']:,.0f} µs/event (Postgres not counted)"))
    if direct.get("sustained"):
        d = direct["sustained"]
        rows.append(("direct max sustained",
                     f"{'>= ' if d['workload_limited'] else ''}{d['committed_events_per_second']:,.0f} ev/s",
                     f"{d['sessions']} sessions, lateness slope {d['lateness_slope']:+.4f} s/s "
                     f"-> {'flat' if d['flat'] else 'growing'}; "
                     f"turnlog sustained = {r.get('sustained_over_direct_sustained', nan):.2f} x"))
    if direct.get("at_50"):
        d = direct["at_50"]
        rows.append(("direct commit at 50%", f"p50 {d['commit_p50_ms']:.1f} / p99 {d['commit_p99_ms']:.1f} ms",
                     f"{d['turns']} turns at {d['events_per_second']:,.0f} ev/s ({d['sessions']} sessions); "
                     f"store-side p99 {d['turn_to_store_p99_ms']:.1f} ms"))
        rows.append(("turnlog turn p99 / direct commit p99",
                     f"{r.get('ack_p99_at_50_over_direct_commit_p99', nan):.2f} acknowledged",
                     f"complete_turn p99 over direct commit p99 at 50% (target <= 2); turn-to-store p99: "
                     f"{r.get('turn_to_store_p99_at_50_over_direct_commit_p99', nan):.2f} x"))
        lat50 = report.get("latency", {}).get("50%", {})
        rows.append(("write transactions per turn at 50%",
                     f"turnlog {lat50.get('write_transactions_per_turn', nan):.3f} "
                     f"/ direct {d['write_transactions_per_turn']:.3f}",
                     f"= {r.get('write_transactions_per_turn_at_50_over_direct', nan):.3f} (target < 1); "
                     f"direct's own count {d['transactions_per_turn']:.3f}; "
                     f"sink commits / direct's: {r.get('sink_commits_per_turn_at_50_over_direct', nan):.3f}"))
    return rows
