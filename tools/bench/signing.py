"""The CPU cost of write-side isolation (``turnlog/signing.py``), on and off in the same run.

Both sides of a record's signature, on the workload's own payloads, in this process
(``time.process_time``, so other processes on the cores do not count):

- **recorder**: signing one event (``RecordSigner.headers``) against what the
  recorder already spends per event to encode and validate it (``encode_event``
  of the decoded event, then ``decode_event``);
- **sequencer**: :meth:`Sequencer.process` over the same records, with the broker
  replaced by in-memory stand-ins, once with fleet keys (each record signed,
  verified and admitted) and once without (open mode), alternating, best of
  ``rounds`` each.

The figures are microseconds of CPU per event; the ratios compare on with off.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

from turnlog.schemas import SessionStarted, decode_event, encode_event
from turnlog.settings import TopicNames
from turnlog.signing import RecordSigner, RecordVerifier
from turnlog.stream_processors.sequencer import Sequencer, SourceRecord

__all__ = ["signing_cost"]



class _Batch:
    def __init__(self, counts: dict[str, int]) -> None:
        self._counts = counts

    def send(self, topic: str, *, key: bytes | None, value: bytes, partition: int, **_: Any) -> None:
        self._counts[topic] = self._counts.get(topic, 0) + 1

    async def delivered(self) -> list[Any]:
        return []  # no record refused (EmissionBatch.delivered's refusals)


class _Emissions:
    """Counts what would be sent, per topic."""

    atomic = False

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def batch(self) -> _Batch:
        return _Batch(self.counts)


class _Log:
    """A log that was never skipped: the tripwire reads nothing again."""

    def committed(self, partition: int) -> int:
        return 0

    def read(self, partition: int, first: int, last: int, key: bytes | None = None) -> list[Any]:
        return []


def _cpu_us_per_event(work: Callable[[], object], events: int) -> float:
    started = time.process_time()
    work()
    return (time.process_time() - started) * 1e6 / events


_TOPICS = TopicNames("bench")


def _sequence_all(records: list[SourceRecord], verifier: RecordVerifier | None, batch: int) -> dict[str, int]:
    """Sequence ``records`` in batches of ``batch``; returns the records sent per topic."""
    emissions = _Emissions()
    sequencer = Sequencer(
        states={}, changelog="bench-changelog", emissions=emissions, reader=_Log(),  # type: ignore[arg-type]
        topics=_TOPICS, max_buffer=1024, verifier=verifier,
    )

    async def run() -> None:
        for first in range(0, len(records), batch):
            await sequencer.process(records[first:first + batch])

    asyncio.run(run())
    return emissions.counts


def signing_cost(payloads: Sequence[tuple[str, bytes]], *, rounds: int = 3, batch: int = 1000) -> dict[str, Any]:
    """CPU microseconds per event of signing and of admission, on and off (module docstring).

    ``payloads``: ``[(session_id, event bytes)]`` in the order the recorder sends them.
    """
    keyed = [(session_id.encode("utf-8"), value) for session_id, value in payloads]
    events = [decode_event(value) for _, value in keyed]
    # Each record is signed as its session's fleet (its session.started's), as the recorder does.
    fleet_of = {event.session_id: event.fleet for event in events if isinstance(event, SessionStarted)}
    fleets = [fleet_of[event.session_id] for event in events]
    keys = {fleet: secrets.token_urlsafe(32) for fleet in set(fleets)}
    signer = RecordSigner(keys)
    verifier = RecordVerifier(keys, secrets.token_urlsafe(32))
    n = len(keyed)

    def validate() -> None:
        for event in events:
            decode_event(encode_event(event))

    def sign() -> None:
        for fleet, (key, value) in zip(fleets, keyed, strict=True):
            signer.headers(fleet, key, value)

    unsigned = [SourceRecord(key, value, 0, offset) for offset, (key, value) in enumerate(keyed)]
    signed = [
        SourceRecord(key, value, 0, offset, signer.headers(fleet, key, value))
        for offset, (fleet, (key, value)) in enumerate(zip(fleets, keyed, strict=True))
    ]
    # Both runs must do the same work: every record emitted, none refused.
    off_counts, on_counts = _sequence_all(unsigned, None, batch), _sequence_all(signed, verifier, batch)
    if off_counts.get(_TOPICS.transcript) != n or on_counts != off_counts:
        raise RuntimeError(f"signing bench: open mode sent {off_counts}, signed {on_counts}, of {n} records")
    validate_us, sign_us, off_us, on_us = [], [], [], []
    for _ in range(rounds):
        validate_us.append(_cpu_us_per_event(validate, n))
        sign_us.append(_cpu_us_per_event(sign, n))
        off_us.append(_cpu_us_per_event(lambda: _sequence_all(unsigned, None, batch), n))
        on_us.append(_cpu_us_per_event(lambda: _sequence_all(signed, verifier, batch), n))
    recorder_off, recorder_sign = min(validate_us), min(sign_us)
    sequencer_off, sequencer_on = min(off_us), min(on_us)
    return {
        "events": n,
        "recorder_encode_validate_us": recorder_off,
        "recorder_sign_us": recorder_sign,
        "recorder_on_over_off": (recorder_off + recorder_sign) / recorder_off,
        "sequencer_off_us": sequencer_off,
        "sequencer_on_us": sequencer_on,
        "sequencer_on_over_off": sequencer_on / sequencer_off,
    }
