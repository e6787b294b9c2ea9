"""Forgetting a session on request, and reading the erasure ledger (replay, verify).

:func:`request_erasure` (``turnlog forget``) is
:func:`turnlog.sinks.erasure_request.request_erasure`, which the API runs too
(docs/design.md, "Encryption and erasure"); :func:`read_ledger` reads
``<prefix>.erasures`` to its end.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, TopicPartition

from turnlog import kafka
from turnlog.crypto.ledger_signatures import ledger_verifier
from turnlog.schemas import EventValidationError
from turnlog.schemas.erasure import Erasure
from turnlog.settings import TurnlogSettings
from turnlog.sinks.erasure_request import ErasureNotFound, ErasureOutcome, request_erasure

__all__ = ["ErasureNotFound", "ErasureOutcome", "request_erasure", "read_ledger"]


def read_ledger(settings: TurnlogSettings, *, timeout: float = 30.0) -> dict[tuple[str, str], Erasure]:
    """Every erasure in ``<prefix>.erasures`` (read to its end), by ``(session id, fleet)``. A
    record that does not decode, or (``erasure_issuers`` set) is not signed by an erasure issuer,
    is skipped (it names nothing to forget); a missing topic is an empty ledger.

    Raises:
        BrokerError: the broker cannot be reached.
    """
    topic = settings.topics.erasures
    with kafka.OffsetReader(settings) as offsets:
        try:
            ends = offsets.record_ends(topic)
        except kafka.UnknownTopicError:
            return {}
        starts = {p: marks.low for p, marks in offsets.watermarks(topic, list(ends)).items()}
    pending = {p for p, end in ends.items() if end > starts[p]}
    ledger: dict[tuple[str, str], Erasure] = {}
    verifier = ledger_verifier(settings)
    if not pending:
        return ledger
    consumer = kafka.consumer(settings, group_id=f"{settings.topic_prefix}-ledger-reader",
                              **{"enable.auto.offset.store": False, "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(pending)])
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for record in consumer.consume(500, 1.0):
                error = record.error()
                partition = record.partition()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF and partition is not None:
                        pending.discard(partition)
                    continue
                try:
                    erasure = verifier.read(record.key(), record.value(), record.headers()).erasure
                except EventValidationError:
                    continue
                ledger[(erasure.session_id, erasure.fleet)] = erasure
                if partition is not None and (record.offset() or 0) + 1 >= ends[partition]:
                    pending.discard(partition)
        if pending:
            raise kafka.BrokerError(f"{topic}: partitions {sorted(pending)} not read to their end in {timeout:.0f} s")
    finally:
        consumer.close()
    return ledger
