"""Where a completed turn's turn-to-store time goes, stage by stage.

For every completed turn of the sessions whose keys match a prefix, four instants:

- ``emitted_at``: the recorder stamped the event (``complete_turn``);
- the ``events`` record's CreateTime: the drainer handed it to librdkafka
  (after the spool's group commit);
- the ``transcript`` record's CreateTime: the sequencer handed its emission to
  librdkafka (after the broker delivered the event and Faust gave it to the agent);
- the commit of the row in Postgres (``pg_xact_commit_timestamp``).

So ``spool`` = recorder and spool, ``sequence`` = the events record's linger,
broker, fetch and the sequencer's batch, ``store`` = the emission's ack, the
changelog write, the sink's fetch, batch and transaction. All in milliseconds;
the record timestamps and ``emitted_at`` come from the same machine's clock.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import TopicPartition

from turnlog import kafka
from turnlog.schemas import TurnCompleted, decode_event
from turnlog.schemas.statuses import TurnStatus
from turnlog.settings import TurnlogSettings
from turnlog.tools.bench.baselines import percentile

__all__ = ["StageLatencies", "turn_stage_latencies"]

_READ_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class StageLatencies:
    """Per completed turn, milliseconds spent in each stage (same order in each list)."""

    spool: list[float]
    sequence: list[float]
    store: list[float]
    total: list[float]

    def summary(self) -> dict[str, Any]:
        """``{stage: {"p50": ms, "p99": ms, "max": ms}}`` and ``turns``."""
        out: dict[str, Any] = {"turns": len(self.total)}
        for name in ("spool", "sequence", "store", "total"):
            values = getattr(self, name)
            out[name] = {"p50": percentile(values, 50), "p99": percentile(values, 99),
                         "max": max(values) if values else float("nan")}
        return out


def _completed_turn_times(
    settings: TurnlogSettings, topic: str, sessions: re.Pattern[str]
) -> dict[tuple[str, int], float]:
    """``{(session key, seq): record CreateTime in epoch ms}`` of every ``turn.completed`` record in ``topic``
    whose session key matches ``sessions``."""
    with kafka.OffsetReader(settings) as offsets:
        marks = offsets.watermarks(topic)
        ends = offsets.record_ends(topic)  # the transcript is written in transactions: it may end in markers
    consumer = kafka.consumer(settings, group_id=f"bench-stages-{uuid.uuid4().hex[:8]}")
    times: dict[tuple[str, int], float] = {}
    try:
        left = {p for p, m in marks.items() if ends[p] > m.low}
        consumer.assign([TopicPartition(topic, p, marks[p].low) for p in left])
        deadline = time.monotonic() + _READ_TIMEOUT_SECONDS
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: not read to its end within {_READ_TIMEOUT_SECONDS:.0f} s")
            for record in consumer.consume(5000, 0.5):
                if record.error() is not None:
                    continue
                partition, offset = record.partition(), record.offset()
                assert partition is not None and offset is not None
                if offset >= ends[partition] - 1:
                    left.discard(partition)
                value = record.value()
                if value is None:
                    continue
                event = decode_event(value)
                if isinstance(event, TurnCompleted) and sessions.match(event.session_id):
                    times[(event.session_id, event.seq)] = float(record.timestamp()[1])
    finally:
        consumer.close()
    return times


def turn_stage_latencies(settings: TurnlogSettings, dsn: str, key_prefix: str) -> StageLatencies:
    """Stage latencies of the completed turns of sessions whose key starts with ``key_prefix``
    (in which ``%`` stands for any run of characters, as in :func:`probes.turn_latencies_ms`:
    ``workload.replayed_keys``).

    ``dsn`` is a psycopg (not SQLAlchemy) URL. Turns missing from either topic
    or the store are left out.

    Raises:
        TimeoutError: a topic was not read to its end within 60 s.
        BrokerError: the broker did not answer.
    """
    sessions = re.compile(".*".join(re.escape(part) for part in key_prefix.split("%")), re.DOTALL)
    produced = _completed_turn_times(settings, settings.topics.events, sessions)
    emitted = _completed_turn_times(settings, settings.topics.transcript, sessions)
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT t.session_id, t.seq, EXTRACT(EPOCH FROM e.emitted_at) * 1000,"
            " EXTRACT(EPOCH FROM pg_xact_commit_timestamp(t.xmin)) * 1000"
            " FROM transcript_turns t JOIN session_events e ON e.session_id = t.session_id AND e.seq = t.seq"
            " WHERE t.session_id LIKE %s AND t.status = %s",
            (key_prefix + "%", str(TurnStatus.COMPLETE)),
        ).fetchall()
    spool, sequence, store, total = [], [], [], []
    for session_id, seq, emitted_ms, committed_ms in rows:
        at_events, at_transcript = produced.get((session_id, seq)), emitted.get((session_id, seq))
        if at_events is None or at_transcript is None or committed_ms is None:
            continue
        emitted_ms, committed_ms = float(emitted_ms), float(committed_ms)
        spool.append(at_events - emitted_ms)
        sequence.append(at_transcript - at_events)
        store.append(committed_ms - at_transcript)
        total.append(committed_ms - emitted_ms)
    return StageLatencies(spool, sequence, store, total)
