"""Paired runs of the pipeline in two modes (a setting on, then off), for the bench's on/off phases.

Each mode runs as a *variant* of its own (topics, consumer groups, database and pipeline);
this module holds what every such phase shares: the order of the variants (alternating, so a
drift of the shared machine falls on both modes), readings of the sink's applied records and
of each process's CPU time, the figures between two readings, pooling the runs of a mode, and
the on/off ratios. Used by ``transactions.py`` (the sequencer's Kafka transactions) and
``encryption.py`` (envelope encryption).
"""

from __future__ import annotations

import os
import socket
import time
import urllib.error
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnlog import kafka
from turnlog.deploy.processes import ServiceProcess
from turnlog.settings import TurnlogSettings
from turnlog.tools.bench import baselines as base
from turnlog.tools.bench.probes import cpu_seconds, sink_batches

__all__ = [
    "Reading", "variant_order", "per_event_us", "pool_runs", "on_over_off", "moderate_on_off", "take_reading",
    "wait_applied",
    "phase_figures", "latency_figures", "transcript_end", "local_broker_pid", "free_port", "SERVICES",
    "APPLY_TIMEOUT_SECONDS",
]

#: Longest a variant's first record may take to be applied, and its load's tail (seconds).
FIRST_RECORD_TIMEOUT_SECONDS = 120.0
APPLY_TIMEOUT_SECONDS = 120.0
#: How often the sink's applied records are read while waiting (seconds; each read is one scrape of its /metrics).
POLL_SECONDS = 0.1
#: The pipeline's services, whose CPU per event adds up to the pipeline's.
SERVICES = ("sequencer", "sink", "finalizer")


def variant_order(repetitions: int) -> list[bool]:
    """The modes to run, in order (True: the setting on): off, on, then on, off, and so on,
    ``repetitions`` pairs.

    >>> variant_order(2)
    [False, True, True, False]
    """
    order: list[bool] = []
    for repetition in range(repetitions):
        order += [False, True] if repetition % 2 == 0 else [True, False]
    return order


def per_event_us(cpu: dict[str, float], events: int) -> dict[str, float]:
    """Each process's CPU seconds of ``cpu`` as microseconds per event over ``events`` (NaN for none)."""
    return {name: seconds / events * 1e6 if events > 0 else float("nan") for name, seconds in cpu.items()}


def pool_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One mode's figures over its ``runs``, flat, for :func:`on_over_off`. A run is a variant's
    report: ``{"capacity": ..., "moderate": ...}`` (either may be missing), each phase's figures
    as :func:`phase_figures` gives them plus ``records`` (applied by the sink) and ``transactions``
    (the sequencer committed to the transcript), and the moderate phase's ``load_seconds``,
    ``samples_ms`` (turn-to-store) and ``complete_ms`` (``complete_turn``). The pooled figures:

    - ``capacity_events_per_second``: events applied over seconds, summed over the runs;
    - ``capacity_<process>_us_per_event`` and ``moderate_<process>_us_per_event``: CPU
      microseconds per event, CPU seconds summed over the runs over their events; a process
      some run did not measure (the broker) is left out; ``..._pipeline_us_per_event``: the
      sequencer, sink and finalizer together; ``..._measured_us_per_event``: every process
      measured (the generator and the broker too; Postgres is not measured);
    - ``moderate_offered_events_per_second``: events over the load's seconds;
      ``moderate_p50_ms``, ``_p95_ms``, ``_p99_ms``: turn-to-store, nearest rank over every
      run's turns; ``moderate_complete_turn_p99_ms``
      (the recorder's acknowledgement, which the sequencer's mode does not touch: a control);
    - ``capacity_events_per_transaction``, ``moderate_events_per_transaction``: records the
      sink applied in the phase per transaction the sequencer committed to the transcript
      in it (NaN with none).

    NaN where no run has the figure.
    """
    out: dict[str, Any] = {"runs": len(runs)}
    for phase in ("capacity", "moderate"):
        figures = [run[phase] for run in runs if phase in run]
        events = sum(f["events"] for f in figures)
        seconds = sum(f["seconds"] for f in figures)
        records, transactions = sum(f["records"] for f in figures), sum(f["transactions"] for f in figures)
        if phase == "capacity":
            out["capacity_events_per_second"] = events / seconds if seconds > 0 else float("nan")
        else:  # over the load alone (its CPU span runs on until the last event is applied)
            offered = sum(f["load_seconds"] for f in figures)
            out["moderate_offered_events_per_second"] = events / offered if offered > 0 else float("nan")
        shared = set.intersection(*(set(f["cpu_seconds"]) for f in figures)) if figures else set()
        cpu = {name: sum(f["cpu_seconds"][name] for f in figures) for name in sorted(shared)}
        for name, us in per_event_us(cpu, events).items():
            out[f"{phase}_{name}_us_per_event"] = us
        services = [out[f"{phase}_{name}_us_per_event"] for name in SERVICES if name in cpu]
        out[f"{phase}_pipeline_us_per_event"] = sum(services) if len(services) == len(SERVICES) else float("nan")
        out[f"{phase}_measured_us_per_event"] = sum(per_event_us(cpu, events).values()) if cpu else float("nan")
        out[f"{phase}_events_per_transaction"] = records / transactions if transactions > 0 else float("nan")
    samples = [ms for run in runs if "moderate" in run for ms in run["moderate"]["samples_ms"]]
    acks = [ms for run in runs if "moderate" in run for ms in run["moderate"]["complete_ms"]]
    for q in (50, 95, 99):
        out[f"moderate_p{q}_ms"] = base.percentile(samples, q)
    out["moderate_turns"] = len(samples)
    out["moderate_complete_turn_p99_ms"] = base.percentile(acks, 99)
    return out


def on_over_off(on: dict[str, Any], off: dict[str, Any]) -> dict[str, float]:
    """Each numeric figure of ``on`` over the same of ``off`` (both from :func:`pool_runs`);
    NaN when either is missing or NaN, or ``off``'s is 0."""
    ratios = {}
    for key, value in on.items():
        if key == "runs" or not isinstance(value, (int, float)):
            continue
        other = off.get(key)
        if other is None or other == 0 or other != other or value != value:  # NaN is not equal to itself
            ratios[key] = float("nan")
        else:
            ratios[key] = value / other
    return ratios


def moderate_on_off(runs: Sequence[dict[str, Any]], *, is_on: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The moderate-load figures of the on and the off variants among ``runs`` (variants that
    drain no backlog: :func:`pool_runs` without its ``capacity_*`` figures), pooled per mode,
    with ``on_over_off`` of the pools and ``pairs``: ``on_over_off`` of each repetition (the
    n-th on run against the n-th off run; as many of each, or ValueError)."""
    on_runs = [run for run in runs if is_on(run)]
    off_runs = [run for run in runs if not is_on(run)]
    pooled_on, pooled_off = _moderate(pool_runs(on_runs)), _moderate(pool_runs(off_runs))
    pairs = [on_over_off(_moderate(pool_runs([a])), _moderate(pool_runs([b])))
             for a, b in zip(on_runs, off_runs, strict=True)]
    return {"off": pooled_off, "on": pooled_on, "on_over_off": on_over_off(pooled_on, pooled_off), "pairs": pairs}


def _moderate(pooled: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in pooled.items() if not key.startswith("capacity_")}


@dataclass(frozen=True, slots=True)
class Reading:
    """One moment: ``at`` (monotonic seconds), the records the sink has applied, and each watched
    process's CPU seconds so far (``generator``: this process)."""

    at: float
    applied: int
    cpu: dict[str, float]


def take_reading(processes: dict[str, ServiceProcess], port: int, watched: dict[str, int]) -> Reading:
    """Raises RuntimeError when a service exited (its log named)."""
    for process in processes.values():
        if not process.alive():
            raise RuntimeError(f"{process.name} exited; see {process.log_path}")
    try:
        applied = int(sink_batches(port).records)
    except (urllib.error.URLError, OSError):  # its metrics server not answering yet
        applied = 0
    times = os.times()
    cpu = {name: cpu_seconds(pid) for name, pid in watched.items()}
    cpu["generator"] = times.user + times.system
    return Reading(time.monotonic(), applied, cpu)


def wait_applied(
    processes: dict[str, ServiceProcess], port: int, total: int, timeout: float, watched: dict[str, int], *,
    start_at_first: bool = False,
) -> tuple[Reading, Reading]:
    """Poll until the sink has applied ``total`` records; ``(first, last)`` readings, ``first`` the
    first with any record applied when ``start_at_first``, else the first taken.

    Raises:
        RuntimeError: not applied within ``timeout`` seconds, none within
            ``FIRST_RECORD_TIMEOUT_SECONDS``, or a service exited.
    """
    began = time.monotonic()
    deadline = began + timeout
    first: Reading | None = None
    while True:
        reading = take_reading(processes, port, watched)
        if first is None and (reading.applied > 0 or not start_at_first):
            first = reading
        if reading.applied >= total:
            assert first is not None  # set above: total > 0 records are applied
            return first, reading
        if reading.at > deadline or (reading.applied == 0 and reading.at > began + FIRST_RECORD_TIMEOUT_SECONDS):
            logs = Path(processes["sink"].log_path).parent
            raise RuntimeError(f"the sink applied {reading.applied:,} of {total:,} records in"
                               f" {reading.at - began:.0f} s; see the logs in {logs}")
        time.sleep(POLL_SECONDS)


def phase_figures(first: Reading, last: Reading, *, events: int, generator: bool) -> dict[str, Any]:
    """CPU seconds of each process between two readings (the generator's only when it ran then),
    microseconds per event over ``events``, and cores over the span."""
    seconds = last.at - first.at
    cpu = {name: last.cpu[name] - first.cpu[name] for name in first.cpu if generator or name != "generator"}
    return {
        "events": events,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "us_per_event": per_event_us(cpu, events),
        "cores": {name: used / seconds if seconds > 0 else float("nan") for name, used in cpu.items()},
    }


def latency_figures(load: Any, samples: list[float]) -> dict[str, Any]:
    """A moderate-load run's latencies: ``load`` (a ``LoadResult``: what the generator sent and each
    ``complete_turn``'s milliseconds) and ``samples`` (each stored turn's turn-to-store milliseconds)."""
    return {
        "offered_events_per_second": load.events_per_second,
        "load_seconds": load.seconds,
        "turns": load.turns,
        "turns_stored": len(samples),
        "p50_ms": base.percentile(samples, 50),
        "p95_ms": base.percentile(samples, 95),
        "p99_ms": base.percentile(samples, 99),
        "complete_turn_p99_ms": base.percentile(load.complete_ms, 99),
        "samples_ms": samples,
        "complete_ms": load.complete_ms,
    }


def transcript_end(settings: TurnlogSettings) -> int:
    """Sum of the transcript's high watermarks: its records, and the markers of its transactions."""
    with kafka.OffsetReader(settings) as offsets:
        return sum(marks.high for marks in offsets.watermarks(settings.topics.transcript).values())


def local_broker_pid() -> int | None:
    """The pid of ``deploy/kafka.sh``'s single broker when it runs here (its pid file, its command line
    naming Kafka), else None."""
    state = Path(os.environ.get("TURNLOG_STATE_DIR", Path.home() / ".cache" / "turnlog"))
    try:
        pid = int((state / "kafka" / "kafka.pid").read_text().split()[0])
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return pid if b"kafka.Kafka" in cmdline.read() else None
    except (OSError, ValueError, IndexError):
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
