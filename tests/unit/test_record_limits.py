"""The record size limits agree: what the recorder writes, the sequencer can carry to the
transcript and to the DLQ, and what the sequencer sends, the topics take."""

from __future__ import annotations

from turnlog.deploy.topics import TOPIC_MAX_MESSAGE_BYTES, topic_specs
from turnlog.dlq import dlq_headers
from turnlog.kafka.replication import Replication
from turnlog.producers.recorder import MAX_EVENT_BYTES
from turnlog.schemas.headers import EventType, type_headers
from turnlog.schemas.session_keys import MAX_SESSION_KEY
from turnlog.settings import TurnlogSettings
from turnlog.stream_processors.emitter import MAX_RECORD_BYTES, MESSAGE_MAX_BYTES, record_bytes
from turnlog.stream_processors.sequencer import MAX_REASON_BYTES, MAX_STATE_BYTES

#: The longest session key (schemas/session_keys.py: 265 ASCII characters): every record's key.
LONGEST_KEY = b"s" * MAX_SESSION_KEY
#: librdkafka's LZ4 frame of incompressible data: the bytes as they are, plus a block header per
#: 64 KiB block and the frame's header and footer (LZ4F_compressFrameBound, rounded up).
_LZ4_OVERHEAD = 4 * (MESSAGE_MAX_BYTES // 65_536 + 1) + 32
#: A record batch's header (61 bytes in v2) and one record's framing (varints, attributes), rounded up.
_BATCH_OVERHEAD = 61 + 64


def test_an_event_the_recorder_writes_fits_a_transcript_record() -> None:
    longest_type = max((type_headers(kind) or [] for kind in EventType), key=lambda h: record_bytes(None, None, h))
    assert record_bytes(LONGEST_KEY, b"v" * MAX_EVENT_BYTES, longest_type) <= MAX_RECORD_BYTES


def test_an_event_the_recorder_writes_fits_a_dlq_record_with_the_longest_reason() -> None:
    topic = TurnlogSettings(topic_prefix="p" * 200).topics.events  # Kafka allows 249 characters
    headers = dlq_headers("r" * MAX_REASON_BYTES, topic, 2**31 - 1, 2**63 - 1)
    assert record_bytes(LONGEST_KEY, b"v" * MAX_EVENT_BYTES, headers) <= MAX_RECORD_BYTES


def test_a_record_the_sequencer_may_send_fits_every_topic_after_compression() -> None:
    assert MAX_RECORD_BYTES < MESSAGE_MAX_BYTES
    assert MESSAGE_MAX_BYTES + _LZ4_OVERHEAD + _BATCH_OVERHEAD <= TOPIC_MAX_MESSAGE_BYTES
    for spec in topic_specs(TurnlogSettings(), Replication(replication_factor=3, min_insync_replicas=2, live_brokers=3)):
        assert spec.config["max.message.bytes"] == str(TOPIC_MAX_MESSAGE_BYTES), spec.topic


def test_a_session_state_record_is_far_under_the_record_limit() -> None:
    assert MAX_STATE_BYTES * 3 < MAX_RECORD_BYTES
