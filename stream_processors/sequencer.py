"""The sequencer (Faust): orders, deduplicates and fences the raw event stream.

Consumes ``<prefix>.events``, keeps one :class:`SessionSequence` per session in
a changelog-backed table, emits ordered events to ``<prefix>.transcript`` on
the same partition, and routes rejects to ``<prefix>.dlq`` with the reason and
the original bytes (headers ``turnlog-reason``, ``turnlog-source-topic``,
``turnlog-source-partition``, ``turnlog-source-offset``).

Offsets are committed by Faust after its producer is flushed, so an emitted
event is durable before the offset that produced it is committed.
"""

from __future__ import annotations

import logging

import faust

from turnlog.schemas import EventValidationError, decode_event
from turnlog.settings import TurnlogSettings
from turnlog.stream_processors import metrics
from turnlog.stream_processors.app import make_app, raw_topic
from turnlog.stream_processors.sequencing import SessionSequence, sequence

__all__ = ["build_sequencer", "TABLE_NAME"]

logger = logging.getLogger(__name__)
TABLE_NAME = "sequencer-state"


def build_sequencer(settings: TurnlogSettings) -> faust.App:
    """The sequencer app (consumer group ``settings.sequencer_group``)."""
    app = make_app(settings, settings.sequencer_group)
    topics = settings.topics
    events = raw_topic(app, topics.events)
    transcript = raw_topic(app, topics.transcript)
    dlq = raw_topic(app, topics.dlq)
    states = app.Table(
        TABLE_NAME,
        default=None,
        key_type=bytes,  # raw keys; values (no value_type) are JSON
        partitions=settings.partitions,
        help="SessionSequence per session id (JSON).",
    )

    async def reject(key: bytes | None, raw: bytes, reason: str, message: faust.types.Message) -> None:
        metrics.DLQ_ROUTED.labels(reason.split(":", 1)[0]).inc()
        logger.warning("DLQ %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason)
        headers = [
            ("turnlog-reason", reason.encode("utf-8")),
            ("turnlog-source-topic", message.topic.encode("utf-8")),
            ("turnlog-source-partition", str(message.partition).encode()),
            ("turnlog-source-offset", str(message.offset).encode()),
        ]
        await dlq.send(key=key, value=raw, headers=headers)

    @app.agent(events, name="sequence-events")
    async def sequence_events(stream: faust.StreamT[bytes]) -> None:
        async for record in stream.events():
            message = record.message
            raw: bytes = record.value
            key: bytes | None = record.key
            try:
                event = decode_event(raw)
            except EventValidationError as e:
                await reject(key, raw, f"invalid: {e.reason}", message)
                continue
            if key != event.session_id.encode("utf-8"):
                await reject(key, raw, f"invalid: record key {key!r} is not the session_id", message)
                continue
            state = SessionSequence.from_json(states.get(key))
            decision = sequence(state, event, raw, message.offset, max_buffer=settings.reorder_buffer_size)
            for out in decision.emit:
                await transcript.send(key=key, value=out, partition=message.partition)
            for held, reason in decision.dlq:
                await reject(key, held, reason, message)
            metrics.EVENTS_EMITTED.inc(len(decision.emit))
            if decision.duplicate:
                metrics.DUPLICATES_DROPPED.inc()
            if decision.replayed:
                metrics.REPLAYED.inc()
            if decision.gap_opened:
                metrics.GAPS_OPENED.inc()
                logger.info("gap in %s: waiting for seq %d (got %d)", event.session_id, state.next_seq, event.seq)
            states[key] = state.to_json()

    return app
