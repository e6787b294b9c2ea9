"""The sequencer's Kafka transactions on and off in the same run (``TURNLOG_SEQUENCER_TRANSACTIONS``).

On, each batch's records of an events partition (transcript and DLQ records, session states)
are written in one transaction, committed per batch per partition
(``stream_processors/transactions.py``); off, one idempotent producer whose emissions are
acknowledged, then the states in a second round trip (``stream_processors/emitter.py``).

Each mode runs as a variant of its own: topics, consumer groups, database and pipeline
(sequencer, sink, finalizer) of its own, on the same workload:

1. **capacity**: the same backlog (``(session key, event bytes)``) is produced to the
   variant's events topic while its pipeline is down; the pipeline then drains it.
   Events/s from the first record the sink applied to the last, counted by the sink's
   ``turnlog_sink_records_total{outcome="applied"}`` (records: the transcript's offsets
   also count the markers that end transactions), and each process's CPU time
   (``/proc/<pid>/stat``) over that span per event applied in it.
2. **moderate load**: the generator (``load.py``, the real recorder) offers about ``rate``
   events/s for ``seconds``. Turn-to-store p50/p95/p99 (``probes.turn_latencies_ms``) once
   the sink has applied every event offered, and each process's CPU from the load's start to
   that moment, per event offered.

Each variant also counts the transactions the sequencer committed to the transcript (the
transcript's offsets less the records applied: one marker per committed transaction), which
checks that the mode asked for is the mode that ran (none off, some on).

Variants alternate off, on, on, off, ... (:func:`variant_order`), so a drift of the shared
machine falls on both modes. Per mode the repetitions are pooled (:func:`pool_runs`): CPU
seconds over events, events over seconds, percentiles over every turn. ``on_over_off``
divides each pooled figure with transactions by the same without (:func:`on_over_off`).

The processes measured: the sequencer, the sink, the finalizer; at moderate load the
generator (this process); and the broker when it is the local one of ``deploy/kafka.sh``
(its pid file under ``TURNLOG_STATE_DIR``), which anything else using that broker adds to.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from sqlalchemy.engine import make_url

from turnlog.deploy.processes import ServiceProcess, start_pipeline, stop_all, wait_all_ready
from turnlog.deploy.topics import create_topics, delete_topics_with_prefix
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.tools.bench import baselines as base
from turnlog.tools.bench.databases import create_database, drop_database
from turnlog.tools.bench.histogram import compare as compare_histogram
from turnlog.tools.bench.histogram import scrape_buckets
from turnlog.tools.bench.histogram import summary as histogram_summary
from turnlog.tools.bench.load import plans_for_rate, run_load
from turnlog.tools.bench.probes import turn_latencies_ms
from turnlog.tools.bench.variants import (
    APPLY_TIMEOUT_SECONDS,
    free_port,
    latency_figures,
    local_broker_pid,
    on_over_off,
    phase_figures,
    pool_runs,
    take_reading,
    transcript_end,
    variant_order,
    wait_applied,
)
from turnlog.tools.bench.workload import SessionPlan, replayed_keys

__all__ = ["variant_order", "pool_runs", "on_over_off", "run_transactions", "MODERATE_RATE"]

#: Events/s of the moderate load: where the whole machine already spends ~2.5 ms of CPU per
#: event (small batches), which sets turn-to-store latency.
MODERATE_RATE = 680.0
#: Longest a variant's backlog may take to drain (seconds).
DRAIN_TIMEOUT_SECONDS = 900.0


def run_transactions(
    settings: TurnlogSettings,
    *,
    admin_url: SecretStr,
    backlog: Sequence[tuple[str, bytes]],
    plans: list[SessionPlan],
    run: str,
    log_dir: Path,
    repetitions: int = 1,
    rate: float = MODERATE_RATE,
    seconds: float = 30.0,
    speed: float = 10.0,
    flush_interval: float = 0.5,
    ready_timeout: float = 180.0,
    keep: bool = False,
) -> dict[str, Any]:
    """Run ``repetitions`` pairs of variants (module docstring) and pool them per mode.

    ``settings``: the run's settings (open mode); each variant gets its own topic prefix
    (``<topic_prefix>-tx<i><on|off>``), consumer groups, database (``turnlog_bench_<run>_tx<i><on|off>``,
    created with ``admin_url``'s role), Faust and spool folders under ``log_dir``, and the mode.
    ``backlog``: the events every variant drains. ``plans``: the workload whose leading sessions
    offer ``rate`` events/s at ``speed`` for ``seconds``. ``keep``: keep the variants' topics
    and databases.

    Returns ``{"runs": [one per variant], "off": ..., "on": ... (pool_runs), "on_over_off": ...,
    "pairs": [on_over_off of each repetition]}`` and the parameters.

    Raises:
        RuntimeError: a variant's pipeline exited, did not drain or apply in time, or did not
            run in the mode asked.
        ValueError: ``plans`` together offer less than ``rate``.
    """
    chosen = plans_for_rate(plans, rate, speed=speed, flush_interval=flush_interval)
    runs = []
    for index, on in enumerate(variant_order(repetitions)):
        name = f"tx{index}{'on' if on else 'off'}"
        runs.append(_variant(settings, on, name, admin_url=admin_url, backlog=backlog, chosen=chosen, run=run,
                             log_dir=log_dir, seconds=seconds, speed=speed, ready_timeout=ready_timeout, keep=keep))
        cap, mod = runs[-1]["capacity"], runs[-1]["moderate"]
        print(f"transactions {'on ' if on else 'off'} ({name}): capacity {cap['events_per_second']:,.0f} ev/s,"
              f" sequencer {cap['us_per_event']['sequencer']:,.0f} µs/event;"
              f" at {mod['offered_events_per_second']:,.0f} ev/s: turn-to-store p50"
              f" {mod['p50_ms']:.1f} / p95 {mod['p95_ms']:.1f} / p99 {mod['p99_ms']:.1f} ms,"
              f" sequencer {mod['us_per_event']['sequencer']:,.0f} µs/event;"
              f" load average {runs[-1]['load_average'][0]:.2f} -> {runs[-1]['load_average'][1]:.2f}")
    on_runs = [r for r in runs if r["transactions"]]
    off_runs = [r for r in runs if not r["transactions"]]
    pooled_on, pooled_off = pool_runs(on_runs), pool_runs(off_runs)
    # Each repetition's own pair (on_runs[i] and off_runs[i] ran one after the other): the spread.
    pairs = [on_over_off(pool_runs([a]), pool_runs([b])) for a, b in zip(on_runs, off_runs, strict=True)]
    return {
        "repetitions": repetitions,
        "rate_asked_events_per_second": rate,
        "sessions": len(chosen),
        "seconds": seconds,
        "backlog_events": len(backlog),
        "runs": runs,
        "off": pooled_off,
        "on": pooled_on,
        "on_over_off": on_over_off(pooled_on, pooled_off),
        "pairs": pairs,
    }


def _variant(
    settings: TurnlogSettings, on: bool, name: str, *, admin_url: SecretStr, backlog: Sequence[tuple[str, bytes]],
    chosen: list[SessionPlan], run: str, log_dir: Path, seconds: float, speed: float, ready_timeout: float,
    keep: bool,
) -> dict[str, Any]:
    """One variant: its database, topics and pipeline; the drain, then the moderate load."""
    admin = make_url(admin_url.get_secret_value())
    database = f"turnlog_bench_{run}_{name}"
    url = admin.set(database=database)
    admin_dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    prefix = f"{settings.topic_prefix}-{name}"
    variant = settings.model_copy(update=dict(
        database_url=SecretStr(url.render_as_string(hide_password=False)),
        topic_prefix=prefix,
        sequencer_group=f"{prefix}-sequencer",
        sink_group=f"{prefix}-sink",
        finalizer_group=f"{prefix}-finalizer",
        faust_data_dir=str(log_dir / name / "faust"),
        spool_dir=str(log_dir / name / "spool"),
        sequencer_transactions=on,
    ))
    assert variant.topics.events == f"{prefix}.events", variant.topics.events  # not the run's own topics
    create_database(admin_dsn, database)
    processes: dict[str, ServiceProcess] = {}
    out: dict[str, Any] = {"name": name, "transactions": on, "load_average": [os.getloadavg()[0]]}
    try:
        engine = open_store(url.render_as_string(hide_password=False)).engine
        upgrade_to_head(engine)
        engine.dispose()
        create_topics(variant)
        base.produce_all(variant, variant.topics.events, backlog)
        port = free_port()
        env = {"TURNLOG_LOG_LEVEL": "WARNING"}
        processes.update(start_pipeline(variant, log_dir / name, services=("sequencer", "finalizer"), extra_env=env))
        processes.update(start_pipeline(variant, log_dir / name, services=("sink",),
                                        extra_env={**env, "TURNLOG_METRICS_PORT": str(port)}))
        wait_all_ready(processes, ready_timeout)
        broker = local_broker_pid()
        watched = {service: p.pid for service, p in processes.items()} | ({"broker": broker} if broker else {})

        # -- capacity: drain the backlog --------------------------------------------------------
        first, last = wait_applied(processes, port, len(backlog), DRAIN_TIMEOUT_SECONDS, watched, start_at_first=True)
        capacity = phase_figures(first, last, events=last.applied - first.applied, generator=False)
        # The transcript was empty: every offset past the records applied is a transaction's marker.
        capacity["records"] = last.applied
        capacity["transactions"] = transcript_end(variant) - last.applied
        capacity["events_per_second"] = capacity["events"] / capacity["seconds"] if capacity["seconds"] > 0 else 0.0
        out["capacity"] = capacity

        # -- moderate load ------------------------------------------------------------------------
        ends_before, applied_before = transcript_end(variant), last.applied
        began = take_reading(processes, port, watched)
        histogram_before = scrape_buckets(port)
        load = asyncio.run(run_load(variant, chosen, speed=speed, seconds=seconds, tag=name))
        _, done = wait_applied(processes, port, applied_before + load.events, APPLY_TIMEOUT_SECONDS, watched)
        moderate = phase_figures(began, done, events=load.events, generator=True)
        moderate["records"] = done.applied - applied_before
        moderate["transactions"] = transcript_end(variant) - ends_before - moderate["records"]
        samples = turn_latencies_ms(dsn, replayed_keys(run, name))
        moderate.update(latency_figures(load, samples))
        # The sink's own histogram of the same turns, beside the bench's figures (histogram.py).
        moderate["sink_histogram"] = compare_histogram(scrape_buckets(port) - histogram_before, moderate)
        print(f"  {name}: {histogram_summary(moderate['sink_histogram'])}")
        out["moderate"] = moderate
        out["load_average"].append(os.getloadavg()[0])
        # The mode asked for is the mode that ran: transactions leave one marker each in the transcript.
        committed = capacity["transactions"] + moderate["transactions"]
        if on != (committed > 0):
            raise RuntimeError(f"variant {name}: asked for transactions {'on' if on else 'off'}, found {committed}"
                               f" transaction markers in {variant.topics.transcript}; see {log_dir / name}")
    finally:
        stop_all(processes)
        if not keep:
            try:
                delete_topics_with_prefix(variant, prefix)
            except Exception as e:  # the broker is away: still drop the database
                print(f"transactions: could not delete the topics {prefix}.* ({e}); delete them by hand")
            drop_database(admin_dsn, database)
    return out



