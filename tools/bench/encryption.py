"""Envelope encryption (``turnlog/crypto``) on and off in the same run: its CPU per event, its
bytes per event, and the pipeline's turn-to-store latency and CPU per event at moderate load.

Two parts (docs/benchmarks.md, "Encryption on and off"):

1. :func:`encryption_cost`, in this process (``time.process_time``, so other processes on the
   cores do not count), on the workload's own events, both modes alternating, best of
   ``rounds`` each:

   - **recorder**: what it does per event without a KEK (encode, then decode: the schema's
     check) against the same plus sealing (the content encoded and encrypted, the event
     encoded again), one :class:`~turnlog.crypto.EpochSealer` per session epoch drawn and
     wrapped inside the timed loop (``wrap_us_per_epoch`` on its own);
   - **reader**: decoding the plain records against decoding and opening the sealed ones with
     a fresh :class:`~turnlog.crypto.EventOpener` each round, so every session epoch's first
     unwrap (HPKE) is paid as a reader that starts cold pays it (``unwrap_us_per_epoch``: a
     cold opener over each epoch's first record less a warm one);
   - **sink**: :func:`~turnlog.sinks.batch.plan_batch` (decode, open, the rows, the stored
     payload re-encoded from the opened event) over the records in batches, plain against
     sealed (checked to plan the same rows);
   - **bytes**: mean record value, plain and sealed.

2. :func:`run_encryption`: the pipeline (sequencer, sink, finalizer) with a keyring of its own
   and recorders that seal (``TURNLOG_ENCRYPTION=required``), and without
   (``TURNLOG_ENCRYPTION=off``), each as a variant with topics, consumer groups, a database
   and a pipeline of its own (``variants.py``), alternating off, on, on, off, ... The same
   moderate load (``load.py``, the real recorder) is offered to each: turn-to-store
   p50/p95/p99, ``complete_turn`` p99, and each process's CPU from the load's start until the
   sink has applied every event, per event offered. Each variant checks that its recorder
   sealed (or did not) as asked.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from sqlalchemy.engine import make_url

from turnlog.crypto import EpochSealer, EventOpener, KekRing
from turnlog.crypto.keys import create_keyring_file, generate_private_key, public_key_text
from turnlog.deploy.processes import ServiceProcess, start_pipeline, stop_all, wait_all_ready
from turnlog.deploy.topics import create_topics, delete_topics_with_prefix
from turnlog.schemas import decode_event, encode_event
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store
from turnlog.sinks.batch import plan_batch
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.sinks.source_records import SourceMessage
from turnlog.tools.bench.databases import create_database, drop_database
from turnlog.tools.bench.histogram import compare as compare_histogram
from turnlog.tools.bench.histogram import scrape_buckets
from turnlog.tools.bench.histogram import summary as histogram_summary
from turnlog.tools.bench.load import plans_for_rate, run_load
from turnlog.tools.bench.probes import turn_latencies_ms
from turnlog.tools.bench.transactions import MODERATE_RATE
from turnlog.tools.bench.variants import (
    APPLY_TIMEOUT_SECONDS,
    free_port,
    latency_figures,
    local_broker_pid,
    moderate_on_off,
    phase_figures,
    take_reading,
    transcript_end,
    variant_order,
    wait_applied,
)
from turnlog.tools.bench.workload import SessionPlan, replayed_keys

__all__ = ["encryption_cost", "run_encryption", "encryption_settings"]

#: Longest the pipeline's services may take to write their ready files (seconds).
READY_TIMEOUT_SECONDS = 180.0


def _cpu_us_per_item(work: Callable[[], object], count: int) -> float:
    """CPU microseconds per item of one call of ``work`` over ``count`` items."""
    started = time.process_time()
    work()
    return (time.process_time() - started) * 1e6 / max(count, 1)


def encryption_cost(
    payloads: Sequence[tuple[str, bytes]], *, rounds: int = 3, batch: int = 500
) -> dict[str, Any]:
    """CPU microseconds per event of sealing and opening, on and off (module docstring, part 1).

    ``payloads``: ``[(session_id, event bytes)]``, plain, in the order the recorder sends them.
    ``batch``: records per :func:`plan_batch` call (the sink's batch size).

    Returns ``events`` and ``epochs``; ``plain_bytes_per_event``, ``sealed_bytes_per_event`` and
    their ratio; for ``recorder``, ``reader`` and ``sink_plan``: ``<side>_off_us``,
    ``<side>_on_us`` (per event) and ``<side>_on_over_off``; ``wrap_us_per_epoch`` and
    ``unwrap_us_per_epoch``; ``added_us_per_event`` (the recorder's and the sink's extra CPU
    together: what one stored event costs more).

    Raises:
        RuntimeError: the sink planned different rows from the sealed records than from the
            plain ones, or refused one.
    """
    events = [decode_event(value) for _, value in payloads]
    ring = KekRing([generate_private_key()])
    kek = ring.current
    epochs = sorted({(event.session_id, event.epoch) for event in events})
    n = len(events)

    def record_plain() -> None:
        for event in events:
            decode_event(encode_event(event))

    def record_sealed() -> None:
        sealers: dict[tuple[str, int], EpochSealer] = {}
        for event in events:
            decode_event(encode_event(event))
            sealer = sealers.get((event.session_id, event.epoch))
            if sealer is None:
                sealer = sealers[(event.session_id, event.epoch)] = EpochSealer(kek, event.session_id, event.epoch)
            encode_event(sealer.seal(event))

    sealers = {epoch: EpochSealer(kek, *epoch) for epoch in epochs}
    plain = [value for _, value in payloads]
    sealed = [encode_event(sealers[(event.session_id, event.epoch)].seal(event)) for event in events]

    def read_plain() -> None:
        for value in plain:
            decode_event(value)

    def read_sealed() -> None:
        opener = EventOpener(ring)  # cold: each epoch's first record unwraps its data key
        for value in sealed:
            opener.open(decode_event(value))

    firsts: dict[tuple[str, int], bytes] = {}
    for event, value in zip(events, sealed, strict=True):
        firsts.setdefault((event.session_id, event.epoch), value)
    first_records = list(firsts.values())
    warm = EventOpener(ring)

    def open_firsts(opener: EventOpener) -> None:
        for value in first_records:
            opener.open(decode_event(value))

    open_firsts(warm)

    def wrap() -> None:
        for session_id, epoch in epochs:
            EpochSealer(kek, session_id, epoch)

    def messages(values: list[bytes]) -> list[list[SourceMessage]]:
        keyed = [SourceMessage("bench.transcript", 0, offset, value, session_id.encode("utf-8"))
                 for offset, ((session_id, _), value) in enumerate(zip(payloads, values, strict=True))]
        return [keyed[first:first + batch] for first in range(0, len(keyed), batch)]

    plain_batches, sealed_batches = messages(plain), messages(sealed)

    def plan_plain() -> None:
        for records in plain_batches:
            plan_batch(records)

    def plan_sealed() -> None:
        opener = EventOpener(ring)
        for records in sealed_batches:
            plan_batch(records, opener)

    # Both modes must plan the same rows and refuse none.
    opener = EventOpener(ring)
    for plain_records, sealed_records in zip(plain_batches, sealed_batches, strict=True):
        off_plan, on_plan = plan_batch(plain_records), plan_batch(sealed_records, opener)
        if off_plan.rejected or on_plan.rejected or off_plan.turns != on_plan.turns:
            raise RuntimeError(f"encryption bench: the sink refused {len(off_plan.rejected)} plain and"
                               f" {len(on_plan.rejected)} sealed records, or planned other turns from them")

    timings: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, work, count in (
            ("recorder_off", record_plain, n), ("recorder_on", record_sealed, n),
            ("reader_off", read_plain, n), ("reader_on", read_sealed, n),
            ("sink_plan_off", plan_plain, n), ("sink_plan_on", plan_sealed, n),
            ("wrap", wrap, len(epochs)),
            ("firsts_cold", lambda: open_firsts(EventOpener(ring)), len(epochs)),
            ("firsts_warm", lambda: open_firsts(warm), len(epochs)),
        ):
            timings.setdefault(name, []).append(_cpu_us_per_item(work, count))
    best = {name: min(values) for name, values in timings.items()}
    out: dict[str, Any] = {
        "events": n,
        "epochs": len(epochs),
        "plain_bytes_per_event": sum(map(len, plain)) / max(n, 1),
        "sealed_bytes_per_event": sum(map(len, sealed)) / max(n, 1),
        "wrap_us_per_epoch": best["wrap"],
        "unwrap_us_per_epoch": best["firsts_cold"] - best["firsts_warm"],
    }
    out["bytes_on_over_off"] = out["sealed_bytes_per_event"] / max(out["plain_bytes_per_event"], 1e-9)
    for side in ("recorder", "reader", "sink_plan"):
        off, on = best[f"{side}_off"], best[f"{side}_on"]
        out.update({f"{side}_off_us": off, f"{side}_on_us": on,
                    f"{side}_on_over_off": on / off if off else float("nan")})
    out["added_us_per_event"] = (out["recorder_on_us"] - out["recorder_off_us"]
                                 + out["sink_plan_on_us"] - out["sink_plan_off_us"])
    return out


def encryption_settings(settings: TurnlogSettings, on: bool, keyring: Path) -> TurnlogSettings:
    """``settings`` with encryption ``on`` (a keyring created at ``keyring``, its public half the
    agents' KEK, ``required``: a process without its key refuses to start) or off (recorders never
    seal; no keyring, no KEK)."""
    if not on:
        return settings.model_copy(update=dict(encryption="off", keyring_file=None, kek_public_key=None))
    public = public_key_text(create_keyring_file(keyring).key)
    return settings.model_copy(update=dict(encryption="required", keyring_file=str(keyring), kek_public_key=public))


def run_encryption(
    settings: TurnlogSettings,
    *,
    admin_url: SecretStr,
    plans: list[SessionPlan],
    run: str,
    log_dir: Path,
    repetitions: int = 1,
    rate: float = MODERATE_RATE,
    seconds: float = 30.0,
    speed: float = 10.0,
    flush_interval: float = 0.5,
    ready_timeout: float = READY_TIMEOUT_SECONDS,
    keep: bool = False,
) -> dict[str, Any]:
    """Run ``repetitions`` pairs of variants, encryption off and on (module docstring, part 2),
    and pool them per mode.

    ``settings``: the run's; each variant gets its own topic prefix (``<topic_prefix>-enc<i><on|off>``),
    consumer groups, database (``turnlog_bench_<run>_enc<i><on|off>``, created with ``admin_url``'s
    role), Faust and spool folders and (on) keyring under ``log_dir``. ``plans``: the workload whose
    leading sessions offer ``rate`` events/s at ``speed`` for ``seconds``. ``keep``: keep the
    variants' topics and databases.

    Returns ``{"runs": [one per variant], "off": ..., "on": ... (variants.pool_runs: the
    ``moderate_*`` figures), "on_over_off": ..., "pairs": [on_over_off of each repetition]}``
    and the parameters.

    Raises:
        RuntimeError: a variant's pipeline exited or did not apply the load in time, or its
            recorder did not run in the mode asked.
        ValueError: ``plans`` together offer less than ``rate``.
    """
    chosen = plans_for_rate(plans, rate, speed=speed, flush_interval=flush_interval)
    runs = []
    for index, on in enumerate(variant_order(repetitions)):
        name = f"enc{index}{'on' if on else 'off'}"
        runs.append(_variant(settings, on, name, admin_url=admin_url, chosen=chosen, run=run, log_dir=log_dir,
                             seconds=seconds, speed=speed, ready_timeout=ready_timeout, keep=keep))
        mod = runs[-1]["moderate"]
        print(f"encryption {'on ' if on else 'off'} ({name}): at {mod['offered_events_per_second']:,.0f} ev/s"
              f" turn-to-store p50 {mod['p50_ms']:.1f} / p95 {mod['p95_ms']:.1f} / p99 {mod['p99_ms']:.1f} ms,"
              f" {sum(mod['us_per_event'].values()):,.0f} µs CPU/event (every process measured);"
              f" load average {runs[-1]['load_average'][0]:.2f} -> {runs[-1]['load_average'][1]:.2f}")
    return {
        "repetitions": repetitions,
        "rate_asked_events_per_second": rate,
        "sessions": len(chosen),
        "seconds": seconds,
        "runs": runs,
        **moderate_on_off(runs, is_on=lambda r: bool(r["encrypted"])),
    }


def _variant(
    settings: TurnlogSettings, on: bool, name: str, *, admin_url: SecretStr, chosen: list[SessionPlan], run: str,
    log_dir: Path, seconds: float, speed: float, ready_timeout: float, keep: bool,
) -> dict[str, Any]:
    """One variant: its database, topics, keyring (on) and pipeline; the moderate load."""
    admin = make_url(admin_url.get_secret_value())
    database = f"turnlog_bench_{run}_{name}"
    url = admin.set(database=database)
    admin_dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    prefix = f"{settings.topic_prefix}-{name}"
    variant = encryption_settings(settings.model_copy(update=dict(
        database_url=SecretStr(url.render_as_string(hide_password=False)),
        topic_prefix=prefix,
        sequencer_group=f"{prefix}-sequencer",
        sink_group=f"{prefix}-sink",
        finalizer_group=f"{prefix}-finalizer",
        faust_data_dir=str(log_dir / name / "faust"),
        spool_dir=str(log_dir / name / "spool"),
    )), on, log_dir / name / "keyring")
    assert variant.topics.events == f"{prefix}.events", variant.topics.events  # not the run's own topics
    create_database(admin_dsn, database)
    processes: dict[str, ServiceProcess] = {}
    out: dict[str, Any] = {"name": name, "encrypted": on, "load_average": [os.getloadavg()[0]]}
    try:
        engine = open_store(url.render_as_string(hide_password=False)).engine
        upgrade_to_head(engine)
        engine.dispose()
        create_topics(variant)
        port = free_port()
        env = {"TURNLOG_LOG_LEVEL": "WARNING"}
        processes.update(start_pipeline(variant, log_dir / name, services=("sequencer", "finalizer"), extra_env=env))
        processes.update(start_pipeline(variant, log_dir / name, services=("sink",),
                                        extra_env={**env, "TURNLOG_METRICS_PORT": str(port)}))
        wait_all_ready(processes, ready_timeout)
        broker = local_broker_pid()
        watched = {service: p.pid for service, p in processes.items()} | ({"broker": broker} if broker else {})

        ends_before = transcript_end(variant)
        began = take_reading(processes, port, watched)
        histogram_before = scrape_buckets(port)
        load = asyncio.run(run_load(variant, chosen, speed=speed, seconds=seconds, tag=name))
        if load.encrypted != on:
            raise RuntimeError(f"variant {name}: asked for encryption {'on' if on else 'off'}, its recorder"
                               f" {'sealed' if load.encrypted else 'did not seal'}; see {log_dir / name}")
        _, done = wait_applied(processes, port, began.applied + load.events, APPLY_TIMEOUT_SECONDS, watched)
        moderate = phase_figures(began, done, events=load.events, generator=True)
        moderate["records"] = done.applied - began.applied
        moderate["transactions"] = transcript_end(variant) - ends_before - moderate["records"]
        samples = turn_latencies_ms(dsn, replayed_keys(run, name))
        moderate.update(latency_figures(load, samples))
        # The sink's own histogram of the same turns, beside the bench's figures (histogram.py).
        moderate["sink_histogram"] = compare_histogram(scrape_buckets(port) - histogram_before, moderate)
        print(f"  {name}: {histogram_summary(moderate['sink_histogram'])}")
        out["moderate"] = moderate
        out["load_average"].append(os.getloadavg()[0])
    finally:
        stop_all(processes)
        if not keep:
            try:
                delete_topics_with_prefix(variant, prefix)
            except Exception as e:  # the broker is away: still drop the database
                print(f"encryption: could not delete the topics {prefix}.* ({e}); delete them by hand")
            drop_database(admin_dsn, database)
    return out
