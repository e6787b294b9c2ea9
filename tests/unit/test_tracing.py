"""Traces (turnlog/tracing.py) without a broker: the W3C header rules, the recorder's turn span and
its header, the framework attributes' bounds, the spool keeping a turn's context, the links' cap."""

from __future__ import annotations

import sys

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from turnlog import tracing
from turnlog.exceptions import ConfigurationError
from turnlog.producers import InvalidTurnError
from turnlog.producers.drainer import Ticket
from turnlog.producers.recorder import MAX_TRACE_ATTRIBUTES, RecordedSession, SessionRecorder
from turnlog.producers.spool import SpooledEvent, SpoolFile
from turnlog.settings import TurnlogSettings
from turnlog.tracing import MAX_HEADERS_SCANNED, MAX_LINKS, TraceContext, Tracing, context_from_headers

GOOD = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def in_memory_tracing(ratio: float = 1.0) -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return tracing.new_tracing("test", ratio, processor=SimpleSpanProcessor(exporter)), exporter


# -- the header -------------------------------------------------------------------------------
def test_a_good_traceparent_and_tracestate_are_read():
    context = context_from_headers([("turnlog-type", b"turn.completed"), ("traceparent", GOOD), ("tracestate", b"k=v")])
    assert context == TraceContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1, "k=v")
    assert context.headers() == (("traceparent", GOOD), ("tracestate", b"k=v"))


@pytest.mark.parametrize(
    "headers",
    [
        [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0")],  # short
        [("traceparent", GOOD + b"0")],  # long
        [("traceparent", GOOD.upper())],  # upper-case hex
        [("traceparent", b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")],  # unknown version
        [("traceparent", b"00-00000000000000000000000000000000-b7ad6b7169203331-01")],  # zero trace id
        [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01")],  # zero span id
        [("traceparent", b"\xff" * 55)],  # not ASCII
        [("traceparent", b"x" * 1_000_000)],  # huge
        [("traceparent", None)],
        [("traceparent", GOOD), ("traceparent", GOOD)],  # two: ambiguous (W3C)
        [("x", b"")] * MAX_HEADERS_SCANNED + [("traceparent", GOOD)],  # past the headers looked at
        [(b"\xff\xfe", b"v"), ("traceparent", 7)],  # a non-UTF-8 name, a value of another type
        ["not a pair"],
        42,
    ],
)
def test_a_malformed_or_hostile_trace_header_is_ignored(headers):
    assert context_from_headers(headers) is None


def test_a_bad_or_oversized_tracestate_is_dropped_and_the_parent_kept():
    for state in (b"k=" + b"v" * tracing.MAX_TRACESTATE_BYTES, b"k=\xff", b"k=\nv"):
        context = context_from_headers([("traceparent", GOOD), ("tracestate", state)])
        assert context is not None and context.tracestate == ""


@pytest.mark.parametrize(
    "state",
    [
        b"!!!!=====,,,," * 30,  # printable ASCII, not W3C members
        b"Upper=1",  # keys are lower-case
        b"k=",  # a member needs a value
        b"a=1,a=2",  # a duplicate key
        ",".join(f"k{i}=v" for i in range(33)).encode(),  # over 32 members
    ],
)
def test_a_tracestate_opentelemetry_would_refuse_is_dropped_before_it_sees_it(state):
    # OpenTelemetry logs a refused tracestate's text at WARNING: a hostile record per log line
    context = context_from_headers([("traceparent", GOOD), ("tracestate", state)])
    assert context is not None and context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert context.tracestate == ""


def test_a_w3c_tracestate_is_kept_and_opentelemetry_reads_every_member():
    state = b"rojo=00f067aa0ba902b7 , congo=t61rcWkgMzE,,tenant@vendor=x y"
    context = context_from_headers([("traceparent", GOOD), ("tracestate", state)])
    assert context is not None and context.tracestate == state.decode()
    assert dict(tracing._span_context(context).trace_state) == {
        "rojo": "00f067aa0ba902b7", "congo": "t61rcWkgMzE", "tenant@vendor": "x y"}


def test_headers_from_aiokafka_and_a_mapping_are_read():
    assert context_from_headers((("traceparent", GOOD),)) is not None
    assert context_from_headers({"traceparent": GOOD}) is not None


# -- the recorder -----------------------------------------------------------------------------
class FakeDrainer:
    """The drainer's face to the recorder: submitted events are kept, spooled and acknowledged at once."""

    degraded = False

    def __init__(self, ack: bool = True):
        self.events: list[SpooledEvent] = []
        self.ack = ack

    def submit(self, events):
        self.events.extend(events)
        ticket = Ticket()
        ticket.spooled.set_result(None)
        if self.ack:
            ticket.acked.set_result(None)
        return [ticket]

    def note_slow_ack(self, waited):
        self.degraded = True


def recorder_session(tracer: Tracing, *, ack: bool = True) -> tuple[RecordedSession, FakeDrainer]:
    recorder = SessionRecorder(TurnlogSettings(ack_wait_seconds=0.05))
    drainer = FakeDrainer(ack)
    recorder._drainer = drainer  # type: ignore[assignment]
    recorder._tracing = tracer
    return RecordedSession(recorder, "s-1", fleet="f", epoch=2, next_seq=5, next_turn_index=0), drainer


def headers_named(event: SpooledEvent, name: str) -> list[bytes]:
    return [value for key, value in event.headers if key == name]


async def test_tracing_off_writes_no_trace_header():
    session, drainer = recorder_session(tracing.NO_TRACING)
    session.set_trace_attributes({"conversation.id": "c-9"})
    await session.complete_turn(0, "user", "hello", trace_attributes={"livekit.speech_id": "sp-1"})
    await session.end()
    assert len(drainer.events) == 2
    assert all(not headers_named(event, "traceparent") for event in drainer.events)


async def test_a_traced_turn_has_a_producer_span_its_header_and_the_framework_ids():
    tracer, exporter = in_memory_tracing()
    session, drainer = recorder_session(tracer)
    session.set_trace_attributes({"conversation.id": "c-9"})
    await session.complete_turn(0, "user", "my secret words", trace_attributes={"livekit.speech_id": "sp-1"})
    [span] = exporter.get_finished_spans()
    assert span.name == "complete_turn" and span.kind is SpanKind.PRODUCER
    attributes = dict(span.attributes or {})
    assert attributes["livekit.speech_id"] == "sp-1" and attributes["conversation.id"] == "c-9"
    assert attributes["turnlog.session_id"] == "s-1" and attributes["turnlog.seq"] == 5
    assert attributes["turnlog.epoch"] == 2 and attributes["turnlog.turn_index"] == 0
    assert attributes["messaging.system"] == "kafka" and attributes["messaging.destination.name"] == "turnlog.events"
    assert "turnlog.degraded" not in attributes
    assert not any("secret" in str(value) for value in attributes.values())
    assert [event.name for event in span.events] == ["spool.fsync", "broker.ack"]
    [header] = headers_named(drainer.events[0], "traceparent")
    context = tracing.parse_traceparent(header)
    assert context is not None and context.trace_id == span.context.trace_id and context.span_id == span.context.span_id


async def test_a_turn_that_returns_on_the_spool_alone_says_it_is_degraded():
    tracer, exporter = in_memory_tracing()
    session, _ = recorder_session(tracer, ack=False)
    await session.complete_turn(0, "user", "hi")
    [span] = exporter.get_finished_spans()
    assert span.attributes["turnlog.degraded"] is True
    assert [event.name for event in span.events] == ["spool.fsync"]


async def test_an_unsampled_turn_has_no_span_and_no_header():
    tracer, exporter = in_memory_tracing(ratio=0.0)
    session, drainer = recorder_session(tracer)
    await session.complete_turn(0, "user", "hi")
    assert exporter.get_finished_spans() == ()
    assert not headers_named(drainer.events[0], "traceparent")


@pytest.mark.parametrize(
    ("attributes", "match"),
    [
        ({"": "x"}, "printable ASCII"),
        ({"a b": "x"}, "printable ASCII"),
        ({"k" * 65: "x"}, "printable ASCII"),
        ({7: "x"}, "printable ASCII"),
        ({"turnlog.session_id": "x"}, "turnlog's"),
        ({"messaging.system": "x"}, "turnlog's"),
        ({"id": 1.5}, "str, int or bool"),
        ({"id": None}, "str, int or bool"),
        ({"id": 2**63}, "64-bit"),
        ({"id": "v" * 257}, "257 bytes"),
        ({"id": "a\x00b"}, "NUL"),
        ({f"k{i}": i for i in range(MAX_TRACE_ATTRIBUTES + 1)}, "the limit is 16"),
        ({f"k{i}": "v" * 250 for i in range(9)}, "bytes; the limit is 2048"),
        (["id"], "must be a mapping"),
    ],
)
async def test_bad_trace_attributes_are_refused_and_nothing_is_recorded(attributes, match):
    session, drainer = recorder_session(tracing.NO_TRACING)
    with pytest.raises(InvalidTurnError, match=match):
        await session.complete_turn(0, "user", "hi", trace_attributes=attributes)
    with pytest.raises(InvalidTurnError, match=match):
        session.set_trace_attributes(attributes)
    assert drainer.events == [] and session.trace_attributes == {} and session.next_seq == 5


async def test_the_session_and_turn_attributes_are_bounded_together():
    session, drainer = recorder_session(tracing.NO_TRACING)
    session.set_trace_attributes({f"s{i}": i for i in range(MAX_TRACE_ATTRIBUTES)})
    with pytest.raises(InvalidTurnError, match="the limit is 16"):
        await session.complete_turn(0, "user", "hi", trace_attributes={"one.more": True})
    with pytest.raises(InvalidTurnError, match="the limit is 16"):
        session.set_trace_attributes({"one.more": True})
    session.set_trace_attributes({"s0": "replaced"})  # a key set again replaces: still 16
    assert session.trace_attributes["s0"] == "replaced" and drainer.events == []


# -- the spool --------------------------------------------------------------------------------
def test_the_spool_keeps_a_turns_context_for_the_recorder_that_adopts_it(tmp_path):
    context = TraceContext(0x1234, 0x5678, 1, "k=v")
    first = SpoolFile(tmp_path)
    first.append([SpooledEvent("t.events", b"s-1", b"{}", "s-1", 0, headers=(("turnlog-fleet", b"f"),
                                                                             *context.headers()))])
    first.close(remove_if_empty=False)  # its recorder is gone: the file is an orphan
    second = SpoolFile(tmp_path)
    adopted = []
    assert second.adopt_orphans(adopted.extend) == 1
    [row] = second.rows_from(0, 10)
    assert context_from_headers(row.event.headers) == context
    assert row.event.headers[0] == ("turnlog-fleet", b"f")
    second.close(remove_if_empty=False)


# -- links and configuration ------------------------------------------------------------------
def test_a_span_links_to_at_most_max_links_and_counts_the_rest():
    tracer, exporter = in_memory_tracing(ratio=0.0)  # a root with a sampled link is sampled whatever the ratio
    links = [TraceContext(i + 1, i + 1) for i in range(10_000)]
    span = tracer.start("process turnlog.transcript", kind="consumer", links=links)
    assert span is not None
    span.end()
    [finished] = exporter.get_finished_spans()
    assert len(finished.links) == MAX_LINKS
    assert finished.attributes["turnlog.links_dropped"] == 10_000 - MAX_LINKS


def test_a_root_span_without_a_sampled_link_follows_the_ratio():
    tracer, exporter = in_memory_tracing(ratio=0.0)
    assert tracer.start("batch", links=[TraceContext(1, 1, flags=0)]) is None
    assert exporter.get_finished_spans() == ()


def test_tracing_is_off_unless_asked_for():
    assert tracing.service_tracing(TurnlogSettings(), "recorder") is tracing.NO_TRACING
    assert tracing.NO_TRACING.start("x") is None and not tracing.NO_TRACING.enabled


def test_tracing_asked_for_without_the_extra_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ConfigurationError, match=r"turnlog\[otel\]"):
        tracing.service_tracing(TurnlogSettings(tracing=True, trace_sample_ratio=0.5), "no-extra")


# -- the sequencer and the finalizer sweep ---------------------------------------------------
class _Emissions:
    """Emissions delivered at once, kept: ``(topic, value, headers)``."""

    atomic = False

    def __init__(self):
        self.sent = []

    def batch(self):
        return self

    def send(self, topic, *, key, value, partition, headers=None, token=None):
        self.sent.append((topic, value, headers or []))

    async def delivered(self):
        return []


class _NoLog:
    def committed(self, partition):
        return 0

    def read(self, *args, **kwargs):
        return []


async def test_the_sequencer_continues_a_sampled_trace_and_carries_it_to_the_transcript():
    from turnlog.schemas import encode_event
    from turnlog.settings import TopicNames
    from turnlog.stream_processors.sequencer import Sequencer, SourceRecord

    from tests.support import EventFactory

    tracer, exporter = in_memory_tracing(ratio=0.0)  # the record's sampled flag decides, not the ratio
    emissions = _Emissions()
    topics = TopicNames("t")
    sequencer = Sequencer(states={}, changelog="t-changelog", emissions=emissions, reader=_NoLog(), topics=topics,
                          max_buffer=8, tracing=tracer)
    f = EventFactory("s-seq")
    parent = TraceContext(0xABC, 0xDEF)
    unsampled = TraceContext(0x123, 0x456, flags=0)
    events = [f.started(0), f.completed(1, 0, "hi"), f.completed(2, 1, "there"), f.ended(3, last_turn=1)]
    headers = [(), parent.headers(), unsampled.headers(), [("traceparent", b"garbage")] * 3]
    records = [SourceRecord(b"s-seq", encode_event(e), 0, offset, h)
               for offset, (e, h) in enumerate(zip(events, headers, strict=True))]
    await sequencer.process(records)
    [span] = exporter.get_finished_spans()
    assert span.kind is SpanKind.CONSUMER and span.name == "process t.events"
    assert span.context.trace_id == parent.trace_id and span.parent.span_id == parent.span_id
    assert span.attributes["turnlog.seq"] == 1 and span.attributes["messaging.kafka.offset"] == 1
    carried = [context_from_headers(h) for topic, _, h in emissions.sent if topic == topics.transcript]
    assert [c is not None for c in carried] == [False, True, False, False]
    assert carried[1].trace_id == parent.trace_id and carried[1].span_id == span.context.span_id


async def test_tracing_off_the_sequencer_adds_no_header():
    from turnlog.schemas import encode_event
    from turnlog.settings import TopicNames
    from turnlog.stream_processors.sequencer import Sequencer, SourceRecord

    from tests.support import EventFactory

    emissions = _Emissions()
    sequencer = Sequencer(states={}, changelog="t-changelog", emissions=emissions, reader=_NoLog(),
                          topics=TopicNames("t"), max_buffer=8)
    f = EventFactory("s-off")
    await sequencer.process([SourceRecord(b"s-off", encode_event(f.started(0)), 0, 0,
                                          TraceContext(1, 2).headers())])
    [(_, _, headers)] = [sent for sent in emissions.sent if sent[0] == "t.transcript"]
    assert context_from_headers(headers) is None


def test_the_finalizer_sweep_has_a_finalize_span_of_its_own(tmp_path):
    from turnlog.sinks import open_store
    from turnlog.sinks.migrate import upgrade_to_head
    from turnlog.sinks.sweep import finalize_now

    store = open_store(f"sqlite:///{tmp_path}/store.db")
    upgrade_to_head(store.engine)
    tracer, exporter = in_memory_tracing(ratio=1.0)
    assert finalize_now(store, "no-such-session", tracer) is False
    [span] = exporter.get_finished_spans()
    assert span.name == "finalize" and span.attributes["turnlog.sweep"] is True
    assert span.attributes["turnlog.finalized"] is False and span.attributes["turnlog.session_id"] == "no-such-session"


async def test_hostile_trace_headers_are_never_copied_on_and_leave_other_sessions_traced():
    from turnlog.schemas import encode_event
    from turnlog.settings import TopicNames
    from turnlog.stream_processors.sequencer import Sequencer, SourceRecord

    from tests.support import EventFactory

    tracer, exporter = in_memory_tracing(ratio=0.0)
    emissions = _Emissions()
    topics = TopicNames("t")
    sequencer = Sequencer(states={}, changelog="t-changelog", emissions=emissions, reader=_NoLog(), topics=topics,
                          max_buffer=8, tracing=tracer)
    hostile, good = EventFactory("s-hostile"), EventFactory("s-good")
    state = ",".join(f"k{i}=" + "v" * 10 for i in range(32)).encode()  # 32 members, near 512 bytes
    flooded = [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-ff"), ("tracestate", state),
               ("x-filler", b"f" * 1_000_000)] + [("x-many", b"v")] * 10_000
    records = [
        SourceRecord(b"s-hostile", encode_event(hostile.started(0)), 0, 0, flooded),
        SourceRecord(b"s-good", encode_event(good.started(0)), 0, 1, TraceContext(0xABC, 0xDEF).headers()),
        SourceRecord(b"s-hostile", encode_event(hostile.ended(1, last_turn=None)), 0, 2,
                     [("traceparent", b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-01")]),  # all-zero ids
    ]
    await sequencer.process(records)
    sent = [(value, headers) for topic, value, headers in emissions.sent if topic == topics.transcript]
    assert len(sent) == 3  # every record sequenced, none refused for its trace headers
    for _, headers in sent:
        assert {name for name, _ in headers} <= {"turnlog-type", "traceparent", "tracestate"}
        assert sum(len(name) + len(value) for name, value in headers) <= 64 + 55 + tracing.MAX_TRACESTATE_BYTES
    carried = [context_from_headers(headers) for _, headers in sent]
    assert [c is not None for c in carried] == [True, True, False]
    assert carried[0].trace_id == 0x0AF7651916CD43DD8448EB211C80319C and carried[1].trace_id == 0xABC
    assert carried[0].tracestate == state.decode() and carried[0].sampled
    assert len(exporter.get_finished_spans()) == 2


async def test_a_failing_tracer_costs_the_sequencer_its_span_never_the_event():
    from turnlog.schemas import encode_event
    from turnlog.settings import TopicNames
    from turnlog.stream_processors.sequencer import Sequencer, SourceRecord

    from tests.support import EventFactory

    class FailingTracing(Tracing):
        def __init__(self):
            super().__init__()
            self.enabled = True

        def start(self, *args, **kwargs):
            raise RuntimeError("an exporter or SDK bug")

    emissions = _Emissions()
    topics = TopicNames("t")
    sequencer = Sequencer(states={}, changelog="t-changelog", emissions=emissions, reader=_NoLog(), topics=topics,
                          max_buffer=8, tracing=FailingTracing())
    f = EventFactory("s-failing")
    events = [f.started(0), f.completed(1, 0, "hi")]
    await sequencer.process([SourceRecord(b"s-failing", encode_event(e), 0, offset, TraceContext(0xABC, 0xDEF).headers())
                             for offset, e in enumerate(events)])
    assert [topic for topic, _, _ in emissions.sent].count(topics.transcript) == 2
    assert topics.dlq not in {topic for topic, _, _ in emissions.sent}


def test_a_failing_tracer_costs_the_sink_its_batch_span_never_the_batch(tmp_path):
    from turnlog.schemas import encode_event
    from turnlog.sinks import open_store
    from turnlog.sinks.migrate import upgrade_to_head
    from turnlog.sinks.service import SinkService
    from turnlog.sinks.source_records import SourceMessage

    from tests.support import EventFactory

    class FailingTracing(Tracing):
        def __init__(self):
            super().__init__()
            self.enabled = True

        def start(self, *args, **kwargs):
            raise RuntimeError("an exporter or SDK bug")

    store = open_store(f"sqlite:///{tmp_path}/store.db")
    upgrade_to_head(store.engine)
    settings = TurnlogSettings(encryption="off", topic_prefix="t")
    sink = SinkService(settings, store)
    sink._tracing = FailingTracing()
    f = EventFactory("s-sink")
    message = SourceMessage(settings.topics.transcript, 0, 0, encode_event(f.started(0)), b"s-sink")
    result = sink.apply([message], [(message, TraceContext(0xABC, 0xDEF), False)])
    assert (result.applied, result.rejected) == (1, 0)


def test_a_failing_tracer_leaves_a_finalization_untraced_inside_the_transaction():
    class FailingTracing(Tracing):
        def start(self, *args, **kwargs):
            raise RuntimeError("an exporter or SDK bug")

    working, _ = in_memory_tracing()
    batch = working.start("batch", sampled_root=True)
    with tracing.batch_scope(FailingTracing(), batch, {}), tracing.finalization_span("s-fin") as span:
        assert span is None


def test_a_flush_returns_by_its_deadline_and_says_so_when_the_collector_hangs():
    import threading

    from opentelemetry.sdk.trace import SpanProcessor

    release = threading.Event()

    class HangingExport(SpanProcessor):  # an OTLP collector that accepts the connection and never answers
        def force_flush(self, timeout_millis=30000):
            release.wait(60)
            return True

    tracer = tracing.new_tracing("test", 1.0, processor=HangingExport())
    tracer.start("turn", sampled_root=True).end()
    flushed: list[bool] = []
    stopping = threading.Thread(target=lambda: flushed.append(tracer.flush(timeout_seconds=0.2)), daemon=True)
    stopping.start()
    stopping.join(timeout=30)  # a liveness bound, not a speed target: without one the stop waits for the collector
    try:
        assert not stopping.is_alive() and flushed == [False]
    finally:
        release.set()


@pytest.mark.parametrize("failing", ["start", "end"])
async def test_a_failing_tracer_costs_the_recorder_its_span_never_the_turn(failing):
    class BrokenSpan(tracing.TraceSpan):
        def end(self, at_ns=None):
            raise RuntimeError("an exporter or SDK bug")

    class FailingTracing(Tracing):
        def __init__(self):
            super().__init__()
            self.enabled = True
            self._working, _ = in_memory_tracing()

        def sample_root(self):
            return True

        def start(self, *args, **kwargs):
            if failing == "start":
                raise RuntimeError("an exporter or SDK bug")
            return BrokenSpan(self._working.start(*args, **kwargs)._span)

    session, drainer = recorder_session(FailingTracing())
    await session.complete_turn(0, "user", "hello")  # returns: the turn is recorded
    await session.end()
    assert [event.seq for event in drainer.events] == [5, 6]
