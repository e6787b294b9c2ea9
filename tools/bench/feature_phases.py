"""The phases that price one feature of the pipeline, each a function ``(work, report) -> None``.

In this process, on the workload's payloads: signing (2b), redaction (2c), encryption's cost per
event (2d) and tracing's (2e). Each of the first three also gives its share of the pipeline's CPU
per event at capacity, read from the report's ``cpu_at_capacity`` when the capacity phase ran
before it (NaN otherwise, as in a run of one phase alone).

On variants of their own (topics, groups, database and pipeline each; ``variants.py``), the feature
on and off under the same load: the sequencer's transactions (1b), encryption (2d) and tracing (2e).
They need no database or pipeline of the run's own, so each also runs alone (``options.only``).
"""

from __future__ import annotations

from turnlog.tools.bench.context import PIPELINE_READY_TIMEOUT_SECONDS, Report, Workload
from turnlog.tools.bench.encryption import encryption_cost, run_encryption
from turnlog.tools.bench.redaction import redaction_cost
from turnlog.tools.bench.signing import signing_cost
from turnlog.tools.bench.tracing import discard_receiver, run_tracing, tracing_cost
from turnlog.tools.bench.transactions import run_transactions

__all__ = [
    "measure_signing",
    "measure_redaction",
    "measure_encryption_cost",
    "measure_tracing_cost",
    "compare_transactions",
    "compare_encryption",
    "compare_tracing",
]


def measure_signing(work: Workload, report: Report) -> None:
    """Signing's CPU per event on and off (``signing.py``), and its share of the pipeline's CPU per
    event at capacity measured in this run: ``signing``."""
    cost = signing_cost(work.payloads)
    added = cost["recorder_sign_us"] + cost["sequencer_on_us"] - cost["sequencer_off_us"]
    pipeline = report.get("cpu_at_capacity", {}).get("pipeline_us_per_event", float("nan"))
    cost["added_us_per_event"] = added
    cost["added_share_of_pipeline_cpu"] = added / pipeline if pipeline else float("nan")
    print(f"signing: recorder +{cost['recorder_sign_us']:.1f} µs/event ({cost['recorder_on_over_off']:.2f} x its"
          f" encode+validate), sequencer decide {cost['sequencer_off_us']:.1f} -> {cost['sequencer_on_us']:.1f}"
          f" µs/event ({cost['sequencer_on_over_off']:.2f} x); +{added:.1f} µs/event ="
          f" {cost['added_share_of_pipeline_cpu']:.1%} of the pipeline's CPU per event at capacity")
    report["signing"] = cost


def measure_redaction(work: Workload, report: Report) -> None:
    """The pattern redactor's CPU per event (``redaction.py``; TURNLOG_REDACTION=patterns), and its share of
    the pipeline's CPU per event at capacity measured in this run (it runs in the agents' processes):
    ``redaction``."""
    cost = redaction_cost(work.payloads)
    pipeline = report.get("cpu_at_capacity", {}).get("pipeline_us_per_event", float("nan"))
    cost["share_of_pipeline_cpu"] = cost["per_event_us"] / pipeline if pipeline else float("nan")
    print(f"redaction (patterns): {cost['completed_us']:.1f} µs per completed turn, {cost['partial_us']:.1f} µs per"
          f" partial; {cost['per_event_us']:.1f} µs/event = {cost['per_event_over_encode_validate']:.2f} x the"
          f" recorder's encode+validate, {cost['share_of_pipeline_cpu']:.1%} of the pipeline's CPU per event")
    report["redaction"] = cost


def measure_encryption_cost(work: Workload, report: Report) -> None:
    """Envelope encryption's CPU and bytes per event on and off (``encryption.py``), and the CPU's
    share of the pipeline's CPU per event at capacity when this run measured it: ``encryption_cost``."""
    cost = encryption_cost(work.payloads)
    pipeline = report.get("cpu_at_capacity", {}).get("pipeline_us_per_event", float("nan"))
    cost["added_share_of_pipeline_cpu"] = cost["added_us_per_event"] / pipeline if pipeline else float("nan")
    print(f"encryption: recorder {cost['recorder_off_us']:.1f} -> {cost['recorder_on_us']:.1f} µs/event, reader"
          f" {cost['reader_off_us']:.1f} -> {cost['reader_on_us']:.1f}, sink planning {cost['sink_plan_off_us']:.1f}"
          f" -> {cost['sink_plan_on_us']:.1f}; wrap {cost['wrap_us_per_epoch']:.0f} / unwrap"
          f" {cost['unwrap_us_per_epoch']:.0f} µs per session epoch; {cost['plain_bytes_per_event']:,.0f} ->"
          f" {cost['sealed_bytes_per_event']:,.0f} bytes/event")
    report["encryption_cost"] = cost


def measure_tracing_cost(work: Workload, report: Report) -> None:
    """Tracing's CPU per event in this process, off and on, stage by stage (``tracing.py``, part 1):
    ``tracing_cost``."""
    work.log_dir.mkdir(parents=True, exist_ok=True)
    with discard_receiver(work.log_dir / "otlp-received-cost") as endpoint:
        cost = tracing_cost(work.payloads, endpoint=endpoint)
    print(f"tracing ({cost['sample_ratio']:.0%} sampled), in process: recorder {cost['recorder_off_us']:.1f} ->"
          f" {cost['recorder_on_us']:.1f} µs/event, sequencer {cost['sequencer_off_us']:.1f} ->"
          f" {cost['sequencer_on_us']:.1f}, sink {cost['sink_off_us']:.1f} -> {cost['sink_on_us']:.1f};"
          f" together {cost['total_on_over_off']:.3f} x ({cost['traced_records']:,} of {cost['events']:,} records"
          " traced)")
    report["tracing_cost"] = cost


def compare_transactions(work: Workload, report: Report) -> None:
    """The sequencer's transactions on and off (``transactions.py``): ``work.payloads`` is the backlog each
    variant drains, ``work.plans`` the workload of the moderate load: ``transactions``."""
    options = work.options
    result = run_transactions(
        work.settings, admin_url=options.admin_url, backlog=work.payloads, plans=work.plans, run=work.run_id,
        log_dir=work.log_dir, repetitions=max(options.transactions_repetitions, 1),
        rate=options.transactions_rate, seconds=options.phase_seconds, speed=options.speed,
        flush_interval=options.flush_interval, ready_timeout=PIPELINE_READY_TIMEOUT_SECONDS, keep=options.keep,
    )
    r, nan = result["on_over_off"], float("nan")
    print(f"transactions on/off ({result['repetitions']} x each, pooled): capacity"
          f" {r.get('capacity_events_per_second', nan):.2f} x, sequencer CPU/event at capacity"
          f" {r.get('capacity_sequencer_us_per_event', nan):.2f} x; at"
          f" {result['on']['moderate_offered_events_per_second']:,.0f} ev/s: sequencer CPU/event"
          f" {r.get('moderate_sequencer_us_per_event', nan):.2f} x, turn-to-store p50"
          f" {r.get('moderate_p50_ms', nan):.2f} x, p99 {r.get('moderate_p99_ms', nan):.2f} x")
    report["transactions"] = result


def compare_encryption(work: Workload, report: Report) -> None:
    """The pipeline with encryption on and off under the same moderate load (``encryption.py``): ``encryption``."""
    options = work.options
    result = run_encryption(
        work.settings, admin_url=options.admin_url, plans=work.plans, run=work.run_id, log_dir=work.log_dir,
        repetitions=max(options.encryption_repetitions, 1), rate=options.encryption_rate,
        seconds=options.phase_seconds, speed=options.speed, flush_interval=options.flush_interval,
        ready_timeout=PIPELINE_READY_TIMEOUT_SECONDS, keep=options.keep,
    )
    r, nan = result["on_over_off"], float("nan")
    print(f"encryption on/off ({result['repetitions']} x each, pooled) at"
          f" {result['on']['moderate_offered_events_per_second']:,.0f} ev/s: turn-to-store p99"
          f" {r.get('moderate_p99_ms', nan):.2f} x, p50 {r.get('moderate_p50_ms', nan):.2f} x; CPU per event of every"
          f" process measured {r.get('moderate_measured_us_per_event', nan):.2f} x, of the pipeline"
          f" {r.get('moderate_pipeline_us_per_event', nan):.2f} x")
    report["encryption"] = result


def compare_tracing(work: Workload, report: Report) -> None:
    """The pipeline with traces on (10 % sampled) and off under the same moderate load (``tracing.py``):
    ``tracing``."""
    options = work.options
    result = run_tracing(
        work.settings, admin_url=options.admin_url, plans=work.plans, run=work.run_id, log_dir=work.log_dir,
        repetitions=max(options.tracing_repetitions, 1), rate=options.encryption_rate,
        seconds=options.phase_seconds, speed=options.speed, flush_interval=options.flush_interval,
        ready_timeout=PIPELINE_READY_TIMEOUT_SECONDS, keep=options.keep,
    )
    r, nan = result["on_over_off"], float("nan")
    print(f"tracing on/off ({result['repetitions']} x each, pooled, {result['sample_ratio']:.0%} sampled) at"
          f" {result['on']['moderate_offered_events_per_second']:,.0f} ev/s: CPU per event of every process measured"
          f" {r.get('moderate_measured_us_per_event', nan):.3f} x, of the pipeline"
          f" {r.get('moderate_pipeline_us_per_event', nan):.3f} x, of the recorder (generator)"
          f" {r.get('moderate_generator_us_per_event', nan):.3f} x; turn-to-store p99"
          f" {r.get('moderate_p99_ms', nan):.2f} x, p50 {r.get('moderate_p50_ms', nan):.2f} x")
    report["tracing"] = result
