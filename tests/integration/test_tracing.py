"""Traces on the real pipeline (recorder in this process, sequencer and sink as processes, the real
broker and Postgres) exported by OTLP/HTTP to a receiver in the test: one turn's trace holds the
recorder's, the sequencer's and (by link) the sink's spans, with the framework's ids the recorder
API put on it; hostile trace headers on the events topic change nothing."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer

from turnlog.producers import SessionRecorder

from tests.integration.test_pipeline import finalized, stored_turns
from tests.otlp import OtlpReceiver, journey, timeline
from tests.support import EventFactory, signed_event, wait_until

TIMEOUT = 90


def exporting_to(receiver: OtlpReceiver) -> dict[str, str]:
    """OTel's own variables: export to the receiver, in batches sent every 100 ms."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}


async def test_one_turns_trace_joins_the_recorder_sequencer_and_sink_with_the_framework_ids(
    new_pipeline, monkeypatch
):
    with OtlpReceiver() as receiver:
        env = exporting_to(receiver)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        pipeline = new_pipeline((), tracing=True, trace_sample_ratio=1.0)
        pipeline.start("sequencer", "sink", env=env)
        pipeline.wait_ready()
        async with SessionRecorder(pipeline.settings) as recorder:
            session = await recorder.start_session(f"tr-{uuid.uuid4().hex[:8]}", fleet="tests", agent_id="a1")
            session.set_trace_attributes({"conversation.id": "conv-42"})
            await session.complete_turn(0, "user", "please cancel my plan",
                                        trace_attributes={"lk.speech_id": "speech-7"})
            await session.end("hangup")
        session_id = session.session_id
        wait_until(lambda: finalized(pipeline, session_id), timeout=TIMEOUT, what=f"{session_id} finalized")
        assert [tuple(t)[:3] for t in stored_turns(pipeline, session_id)] == [(0, "user", "please cancel my plan")]

        def turn_journey():
            spans = receiver.spans()
            turn = [s for s in spans if s.attributes.get("lk.speech_id") == "speech-7"]
            if not turn:
                return None
            trace = journey(spans, turn[0].trace_id)
            names = {(s.service, s.name) for s in trace}
            if ("turnlog-sink", "process " + pipeline.settings.topics.transcript) not in names:
                return None
            return turn[0], trace, spans

        recorded, trace, spans = wait_until(turn_journey, timeout=TIMEOUT, what="the turn's spans from every service")
        print("\n" + timeline(trace))
        # The recorder's span: the turn's ids and the framework's, its spool fsync and broker ack; never the text.
        assert recorded.service == "turnlog-recorder" and recorded.name == "complete_turn" and recorded.kind == "producer"
        assert recorded.attributes["conversation.id"] == "conv-42"
        assert recorded.attributes["turnlog.session_id"] == session_id and recorded.attributes["turnlog.turn_index"] == 0
        assert [name for name, _ in recorded.events] == ["spool.fsync", "broker.ack"]
        assert not any("cancel" in str(value) for s in spans for value in s.attributes.values())
        # The sequencer's span: a child of the recorder's, in the same trace.
        [sequenced] = [s for s in trace if s.service == "turnlog-sequencer" and s.parent_span_id == recorded.span_id]
        assert sequenced.trace_id == recorded.trace_id and sequenced.kind == "consumer"
        assert sequenced.attributes["messaging.destination.name"] == pipeline.settings.topics.events
        assert sequenced.attributes["turnlog.seq"] == recorded.attributes["turnlog.seq"]
        # The sink's batch: its own trace, linked to the sequencer's span (one batch serves many turns).
        sink_batches = [s for s in trace if s.service == "turnlog-sink" and s.kind == "consumer"]
        assert any((recorded.trace_id, sequenced.span_id) in s.links for s in sink_batches)
        assert all(s.trace_id != recorded.trace_id for s in sink_batches)
        assert any(name == "commit" for s in sink_batches for name, _ in s.events)

        # The session's end: its finalize span, under a sink batch, linked to the session.ended context.
        def finalize_span():
            ended = [s for s in receiver.spans() if s.name == "end_session"
                     and s.attributes.get("turnlog.session_id") == session_id]
            if not ended:
                return None
            ended_sequenced = {s.span_id for s in receiver.spans()
                               if s.service == "turnlog-sequencer" and s.parent_span_id == ended[0].span_id}
            return next((s for s in receiver.spans() if s.name == "finalize" and s.service == "turnlog-sink"
                         and any(span_id in ended_sequenced for _, span_id in s.links)), None)

        finalize = wait_until(finalize_span, timeout=TIMEOUT, what="the finalize span")
        assert finalize.attributes["turnlog.finalized"] is True
        assert receiver.refused == 0


async def test_hostile_trace_headers_are_ignored_and_the_events_stored(new_pipeline):
    with OtlpReceiver() as receiver:
        env = exporting_to(receiver)
        pipeline = new_pipeline((), tracing=True, encryption="off", keyring_file=None)
        pipeline.start("sequencer", "sink", env=env)
        pipeline.wait_ready()
        f = EventFactory(f"hostile-tr-{uuid.uuid4().hex[:8]}")
        events = [f.started(0), f.completed(1, 0, "hello"), f.ended(2, last_turn=0)]
        good = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        hostile = [
            [("traceparent", b"00-zz-not-a-context-01"), ("tracestate", b"\xff" * 100_000)],
            [("traceparent", good), ("traceparent", good)] + [("x-filler", b"v")] * 500,
            [("traceparent", b"t" * 200_000)],
        ]
        producer = Producer({"bootstrap.servers": pipeline.settings.bootstrap_servers, "partitioner": "murmur2_random"})
        for event, headers in zip(events, hostile, strict=True):
            key, value, signed = signed_event(pipeline.settings, event)
            producer.produce(pipeline.settings.topics.events, value, key, headers=headers + (signed or []))
        assert producer.flush(30) == 0
        wait_until(lambda: finalized(pipeline, f.session_id), timeout=TIMEOUT, what=f"{f.session_id} finalized")
        assert [tuple(t)[:3] for t in stored_turns(pipeline, f.session_id)] == [(0, "A", "hello")]
        # No span was made from those headers: nothing reached the receiver for this session.
        assert not [s for s in receiver.spans() if s.attributes.get("turnlog.session_id") == f.session_id]
        assert all(process.alive() for process in pipeline.processes.values())
