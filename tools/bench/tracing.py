"""Traces (``turnlog/tracing.py``) on and off in the same run: the pipeline's CPU per event and
turn-to-store latency at moderate load, with 10 % of the turns traced and exported.

Two parts:

1. :func:`tracing_cost`, in this process (``time.process_time``: this process's threads, the
   span exporter's included; other processes on the cores do not count), on the workload's own
   events, both modes alternating, best of ``rounds`` each, the real code of each stage with its
   I/O replaced: the recorder's ``RecordedSession`` (complete_turn, partials, end) over a drainer
   that spools and acknowledges at once; the sequencer's ``Sequencer.process`` over the events
   as records (10 % of the completed turns and ends carrying a sampled ``traceparent``, as the
   recorder writes them) with emissions that are delivered at once; the sink's
   ``SinkService.apply`` over the transcript records in batches, on a SQLite store (each record's
   trace headers read as ``SinkService.run`` reads them). Traced, the spans are exported by
   OTLP/HTTP to the discarding receiver and flushed inside the timed work. The figures: each
   stage's CPU microseconds per event off and on, and all three together, on / off.

2. :func:`run_tracing`: the pipeline (sequencer, sink, finalizer) and the recorders of the load (``load.py``, in this
process) run with ``TURNLOG_TRACING=on`` and ``TURNLOG_TRACE_SAMPLE_RATIO=0.1``, exporting by
OTLP/HTTP to a receiver that reads each request and discards it (:data:`DISCARD_RECEIVER`, a
process of its own, so its CPU is not counted: a collector runs elsewhere), and without
(``TURNLOG_TRACING=off``). Each mode is a variant of its own (topics, consumer groups, database,
pipeline; ``variants.py``), alternating off, on, on, off, ... The same moderate load is offered
to each: turn-to-store p50/p95/p99, ``complete_turn`` p99, and each process's CPU from the load's
start until the sink has applied every event, per event offered (``generator``: this process,
whose recorder makes the turn spans). A traced variant checks that its spans reached the
receiver; an untraced one, that none did.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from sqlalchemy.engine import make_url

from turnlog import tracing as traces
from turnlog.deploy.processes import ServiceProcess, start_pipeline, stop_all, wait_all_ready
from turnlog.deploy.topics import create_topics, delete_topics_with_prefix
from turnlog.producers.drainer import Ticket
from turnlog.producers.recorder import RecordedSession, SessionRecorder
from turnlog.schemas import EventType, SessionEnded, TurnCompleted, TurnPartial, decode_event
from turnlog.schemas.headers import event_type, record_event_type, type_headers
from turnlog.settings import TopicNames, TurnlogSettings
from turnlog.sinks import open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.sinks.service import SinkService
from turnlog.sinks.source_records import SourceMessage
from turnlog.stream_processors.sequencer import Sequencer, SourceRecord
from turnlog.tools.bench.databases import create_database, drop_database
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

__all__ = ["run_tracing", "tracing_cost", "discard_receiver", "TRACE_SAMPLE_RATIO", "DISCARD_RECEIVER"]

#: The share of turns traced in the traced variants (the issue's "10 % sampled").
TRACE_SAMPLE_RATIO = 0.1
READY_TIMEOUT_SECONDS = 180.0
#: An OTLP/HTTP receiver that answers every POST 200 (an empty ExportTraceServiceResponse) and
#: discards the body; it writes "<requests> <bytes>" to the file argv[2] after each one.
DISCARD_RECEIVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, tally = int(sys.argv[1]), sys.argv[2]
seen = [0, 0]
class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        size = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(min(size, 64 << 20))
        seen[0] += 1
        seen[1] += size
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
        with open(tally, "w") as f:
            f.write(f"{seen[0]} {seen[1]}")
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@contextlib.contextmanager
def discard_receiver(tally: Path) -> Iterator[str]:
    """Run :data:`DISCARD_RECEIVER` (a process of its own) writing its counts to ``tally``; yields
    its base URL (what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes)."""
    port = free_port()
    receiver = subprocess.Popen([sys.executable, "-c", DISCARD_RECEIVER, str(port), str(tally)])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        receiver.terminate()
        receiver.wait(10)


def run_tracing(
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
    """Run ``repetitions`` pairs of variants, tracing off and on (module docstring), and pool them
    per mode. Parameters as ``encryption.run_encryption``'s; each variant's topic prefix is
    ``<topic_prefix>-trc<i><on|off>`` and its database ``turnlog_bench_<run>_trc<i><on|off>``.

    Returns ``{"runs": [...], "off": ..., "on": ..., "on_over_off": ..., "pairs": [...]}`` (the
    ``moderate_*`` figures of ``variants.pool_runs``) and the parameters.

    Raises:
        RuntimeError: a variant's pipeline exited or did not apply the load in time, or a traced
            variant exported nothing (an untraced one something).
        ValueError: ``plans`` together offer less than ``rate``.
    """
    chosen = plans_for_rate(plans, rate, speed=speed, flush_interval=flush_interval)
    runs = []
    for index, on in enumerate(variant_order(repetitions)):
        name = f"trc{index}{'on' if on else 'off'}"
        runs.append(_variant(settings, on, name, admin_url=admin_url, chosen=chosen, run=run, log_dir=log_dir,
                             seconds=seconds, speed=speed, ready_timeout=ready_timeout, keep=keep))
        mod = runs[-1]["moderate"]
        print(f"tracing {'on ' if on else 'off'} ({name}): at {mod['offered_events_per_second']:,.0f} ev/s"
              f" turn-to-store p50 {mod['p50_ms']:.1f} / p99 {mod['p99_ms']:.1f} ms,"
              f" {sum(mod['us_per_event'].values()):,.0f} µs CPU/event (every process measured);"
              f" {runs[-1]['exports']} OTLP requests, {runs[-1]['export_bytes']:,} bytes")
    return {
        "repetitions": repetitions,
        "sample_ratio": TRACE_SAMPLE_RATIO,
        "rate_asked_events_per_second": rate,
        "sessions": len(chosen),
        "seconds": seconds,
        "runs": runs,
        **moderate_on_off(runs, is_on=lambda r: bool(r["traced"])),
    }


def _variant(
    settings: TurnlogSettings, on: bool, name: str, *, admin_url: SecretStr, chosen: list[SessionPlan], run: str,
    log_dir: Path, seconds: float, speed: float, ready_timeout: float, keep: bool,
) -> dict[str, Any]:
    """One variant: its database, topics, receiver (on) and pipeline; the moderate load."""
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
        tracing=on,
        trace_sample_ratio=TRACE_SAMPLE_RATIO,
    ))
    assert variant.topics.events == f"{prefix}.events", variant.topics.events  # not the run's own topics
    (log_dir / name).mkdir(parents=True, exist_ok=True)
    tally = log_dir / name / "otlp-received"
    with discard_receiver(tally) as endpoint:
        return _variant_exporting(variant, on, name, endpoint, tally, admin_dsn=admin_dsn, dsn=dsn, database=database,
                                  url=url, prefix=prefix, chosen=chosen, run=run, log_dir=log_dir, seconds=seconds,
                                  speed=speed, ready_timeout=ready_timeout, keep=keep)


def _variant_exporting(
    variant: TurnlogSettings, on: bool, name: str, endpoint: str, tally: Path, *, admin_dsn: str, dsn: str,
    database: str, url: Any, prefix: str, chosen: list[SessionPlan], run: str, log_dir: Path, seconds: float,
    speed: float, ready_timeout: float, keep: bool,
) -> dict[str, Any]:
    exporter_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    saved = {key: os.environ.get(key) for key in exporter_env}
    os.environ.update(exporter_env)  # the load's recorders (this process) export there too
    create_database(admin_dsn, database)
    processes: dict[str, ServiceProcess] = {}
    out: dict[str, Any] = {"name": name, "traced": on, "load_average": [os.getloadavg()[0]]}
    try:
        engine = open_store(url.render_as_string(hide_password=False)).engine
        upgrade_to_head(engine)
        engine.dispose()
        create_topics(variant)
        port = free_port()
        env = {"TURNLOG_LOG_LEVEL": "WARNING", **exporter_env}
        processes.update(start_pipeline(variant, log_dir / name, services=("sequencer", "finalizer"), extra_env=env))
        processes.update(start_pipeline(variant, log_dir / name, services=("sink",),
                                        extra_env={**env, "TURNLOG_METRICS_PORT": str(port)}))
        wait_all_ready(processes, ready_timeout)
        broker = local_broker_pid()
        watched = {service: p.pid for service, p in processes.items()} | ({"broker": broker} if broker else {})

        ends_before = transcript_end(variant)
        began = take_reading(processes, port, watched)
        load = asyncio.run(run_load(variant, chosen, speed=speed, seconds=seconds, tag=name))
        _, done = wait_applied(processes, port, began.applied + load.events, APPLY_TIMEOUT_SECONDS, watched)
        moderate = phase_figures(began, done, events=load.events, generator=True)
        moderate["records"] = done.applied - began.applied
        moderate["transactions"] = transcript_end(variant) - ends_before - moderate["records"]
        samples = turn_latencies_ms(dsn, replayed_keys(run, name))
        moderate.update(latency_figures(load, samples))
        out["moderate"] = moderate
        out["load_average"].append(os.getloadavg()[0])
    finally:
        stop_all(processes)  # a clean stop flushes the services' spans
        out["exports"], out["export_bytes"] = _received(tally, expect_some=on)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if not keep:
            try:
                delete_topics_with_prefix(variant, prefix)
            except Exception as e:  # the broker is away: still drop the database
                print(f"tracing: could not delete the topics {prefix}.* ({e}); delete them by hand")
            drop_database(admin_dsn, database)
    if on and not out["exports"]:
        raise RuntimeError(f"variant {name}: tracing on, but no span reached the receiver; see {log_dir / name}")
    if not on and out["exports"]:
        raise RuntimeError(f"variant {name}: tracing off, but {out['exports']} OTLP requests were sent")
    return out


def _received(tally: Path, *, expect_some: bool, wait_seconds: float = 10.0) -> tuple[int, int]:
    """``(requests, bytes)`` the receiver took; with ``expect_some``, waits up to ``wait_seconds``
    for the exporters' last batches (the recorders' were flushed at close, the services' at stop)."""
    deadline = time.monotonic() + (wait_seconds if expect_some else 0.0)
    while True:
        try:
            requests, size = (int(part) for part in tally.read_text().split())
            return requests, size
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return 0, 0
            time.sleep(0.2)


# -- part 1: the in-process cost of tracing per event -------------------------------------------
class _InstantDrainer:
    """The drainer's face to the recorder: every event spooled and acknowledged at once."""

    degraded = False

    def submit(self, events: Any) -> list[Ticket]:
        ticket = Ticket()
        ticket.spooled.set_result(None)
        ticket.acked.set_result(None)
        return [ticket] * len(events)

    def note_slow_ack(self, waited: float) -> None:
        pass


class _Delivered:
    """Emissions delivered at once (the sequencer's ``Emissions``, without a broker)."""

    atomic = False

    def batch(self) -> _Delivered:
        return self

    def send(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def delivered(self) -> list[Any]:
        return []

    async def flush(self, timeout: float = 30.0) -> int:
        return 0

    async def close(self, timeout: float = 30.0) -> None:
        pass


class _NoLog:
    """The sequencer's log reader: the workload has no gaps, so it is never read again."""

    def committed(self, partition: int) -> int:
        return 0

    def read(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []


def _traced_turn(session_id: str, seq: int, ratio: float) -> bool:
    """Whether the recorder's sampler would trace this event's turn (a stable draw per event)."""
    return (hash((session_id, seq)) & 0xFFFF) < ratio * 0x10000


def tracing_cost(
    payloads: list[tuple[str, bytes]], *, endpoint: str, rounds: int = 3, batch: int = 500,
    ratio: float = TRACE_SAMPLE_RATIO,
) -> dict[str, Any]:
    """CPU microseconds per event of the recorder, the sequencer and the sink with tracing off and
    on (module docstring, part 1). ``payloads``: ``[(session_id, event bytes)]`` in send order;
    ``endpoint``: the OTLP/HTTP receiver the traced spans are exported to; ``batch``: records per
    sequencer and sink batch.

    Returns ``events``, ``traced_records``, and for ``recorder``, ``sequencer``, ``sink`` and
    ``total``: ``<stage>_off_us``, ``<stage>_on_us`` and ``<stage>_on_over_off``.
    """
    import tempfile

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    def tracer(component: str) -> traces.Tracing:
        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"))
        return traces.new_tracing(component, ratio, service=f"bench-{component}", processor=processor)

    on_tracers = {name: tracer(name) for name in ("recorder", "sequencer", "sink")}
    events = [decode_event(value) for _, value in payloads]
    n = len(events)
    topics = TopicNames("bench-tracing")

    async def record(tracing: traces.Tracing) -> None:
        recorder = SessionRecorder(TurnlogSettings(topic_prefix="bench-tracing", ack_wait_seconds=5.0))
        recorder._drainer = _InstantDrainer()  # type: ignore[assignment]  # no spool, no broker: the recorder's own work
        recorder._tracing = tracing
        sessions: dict[str, RecordedSession] = {}
        for event in events:
            session = sessions.get(event.session_id)
            if session is None:
                session = sessions[event.session_id] = RecordedSession(
                    recorder, event.session_id, fleet=None, epoch=0, next_seq=1, next_turn_index=0)
            if isinstance(event, TurnPartial):
                session.update_partial(event.turn_index, event.speaker, event.text, started_at=event.started_at)
                await session.flush_partial()
            elif isinstance(event, TurnCompleted):
                await session.complete_turn(event.turn_index, event.speaker, event.text,
                                            started_at=event.started_at, ended_at=event.ended_at,
                                            input_tokens=event.input_tokens, output_tokens=event.output_tokens)
            elif isinstance(event, SessionEnded):
                await session.end(event.reason, ended_at=event.ended_at)
        tracing.flush()

    # The records as the sequencer reads them: a sampled turn's record carries its traceparent.
    traced_at = {i for i, e in enumerate(events)
                 if isinstance(e, TurnCompleted | SessionEnded) and _traced_turn(e.session_id, e.seq, ratio)}

    def source_records(traced: bool) -> list[SourceRecord]:
        out = []
        for offset, (session_id, value) in enumerate(payloads):
            headers: tuple[tuple[str, bytes], ...] = ()
            if traced and offset in traced_at:
                headers = traces.TraceContext(offset + 1, offset + 1).headers()
            out.append(SourceRecord(session_id.encode("utf-8"), value, 0, offset, headers))
        return out

    plain_records, traced_records = source_records(False), source_records(True)

    async def sequence(tracing: traces.Tracing, records: list[SourceRecord]) -> None:
        sequencer = Sequencer(states={}, changelog="bench-tracing-changelog", emissions=_Delivered(),
                              reader=_NoLog(), topics=topics, max_buffer=1024, tracing=tracing)  # type: ignore[arg-type]  # the reader's face is all it uses
        for first in range(0, len(records), batch):
            await sequencer.process(records[first:first + batch])
        tracing.flush()

    # The transcript records as the sink reads them: its type header, and the sequencer's context.
    transcript = [
        (SourceMessage(topics.transcript, 0, offset, value, session_id.encode("utf-8")),
         [*(type_headers(event_type(event)) or ()),
          *(traces.TraceContext(offset + 7, offset + 7).headers() if offset in traced_at else ())])
        for offset, ((session_id, value), event) in enumerate(zip(payloads, events, strict=True))
    ]

    def sink(tracing: traces.Tracing, folder: str, name: str) -> None:
        settings = TurnlogSettings(topic_prefix="bench-tracing", encryption="off", keyring_file=None,
                                   database_url=f"sqlite:///{folder}/{name}.db")
        store = open_store(settings.database_url)
        store.upgrade_schema()
        service = SinkService(settings, store, consumer_group=f"bench-{name}")
        service._tracing = tracing
        started = time.process_time()
        for first in range(0, len(transcript), batch):
            chunk = transcript[first:first + batch]
            traced = []
            if tracing.enabled:  # as SinkService.run reads each record's headers
                for message, headers in chunk:
                    context = traces.context_from_headers(headers)
                    if context is not None and context.sampled:
                        ended = record_event_type(headers, message.value) is EventType.SESSION_ENDED
                        traced.append((message, context, ended))
            service.apply([message for message, _ in chunk], traced)
        tracing.flush()
        timings.setdefault(f"sink_{'on' if tracing.enabled else 'off'}", []).append(
            (time.process_time() - started) * 1e6 / max(n, 1))
        store.close()

    def timed(name: str, work: Any, *args: Any) -> None:
        started = time.process_time()
        asyncio.run(work(*args))
        timings.setdefault(name, []).append((time.process_time() - started) * 1e6 / max(n, 1))

    timings: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="turnlog-bench-tracing-") as folder:
        for round_ in range(rounds):
            for on in (False, True):
                mode = "on" if on else "off"
                tracers = on_tracers if on else dict.fromkeys(on_tracers, traces.NO_TRACING)
                timed(f"recorder_{mode}", record, tracers["recorder"])
                timed(f"sequencer_{mode}", sequence, tracers["sequencer"], traced_records if on else plain_records)
                sink(tracers["sink"], folder, f"r{round_}{mode}")
    best = {name: min(values) for name, values in timings.items()}
    out: dict[str, Any] = {"events": n, "traced_records": len(traced_at), "sample_ratio": ratio}
    for stage in ("recorder", "sequencer", "sink"):
        stage_off, stage_on = best[f"{stage}_off"], best[f"{stage}_on"]
        out.update({f"{stage}_off_us": stage_off, f"{stage}_on_us": stage_on,
                    f"{stage}_on_over_off": stage_on / stage_off})
    total_off = sum(best[f"{stage}_off"] for stage in ("recorder", "sequencer", "sink"))
    total_on = sum(best[f"{stage}_on"] for stage in ("recorder", "sequencer", "sink"))
    out.update({"total_off_us": total_off, "total_on_us": total_on, "total_on_over_off": total_on / total_off})
    for t in on_tracers.values():
        if t._provider is not None:
            t._provider.shutdown()
    return out
