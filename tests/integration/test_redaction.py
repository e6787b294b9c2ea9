"""Redaction before persistence, end to end on the real broker and Postgres: with TURNLOG_REDACTION=patterns
the raw email, card number and phone number a user says reach neither the recorder's spool file, nor the
events and transcript topics, nor the store, in partials (flushed by the timer, and the one left open at
the end) or completed turns and their tool calls. A session recorded without redaction, beside it, shows
that each of those places would hold them. Both recorders run with encryption off (the pipeline's own
settings seal content), so what keeps the raw text out here is redaction alone."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from sqlalchemy import select

from turnlog.producers import SessionRecorder
from turnlog.producers.pii import PatternRedactor
from turnlog.schemas import decode_event
from turnlog.sinks.tables import session_events, sessions, transcript_turns

from tests.support import wait_until

TIMEOUT = 90
EMAIL = "jane.doe@example.org"
CARD = "4111 1111 1111 1111"
PHONE = "+44 20 7946 0958"
SAID = {EMAIL.encode(), CARD.encode(), PHONE.encode()}
RAW = [*SAID, CARD.replace(" ", "").encode()]  # and the card's digits run together


def _finalized(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        return conn.execute(select(sessions.c.status).where(sessions.c.id == session_id)).scalar() == "finalized"


def _stored(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        turns = conn.execute(
            select(transcript_turns.c.turn_index, transcript_turns.c.text, transcript_turns.c.status, transcript_turns.c.tool_calls)
            .where(transcript_turns.c.session_id == session_id)
            .order_by(transcript_turns.c.turn_index)
        ).all()
        payloads = conn.execute(select(session_events.c.payload).where(session_events.c.session_id == session_id)).scalars().all()
    return [tuple(t) for t in turns], payloads


def _topic_values(settings, topic: str, session_id: str, events: int) -> list[bytes]:
    """The values of ``session_id``'s records in ``topic``, read from the start of every partition until
    each of its seqs ``0 .. events-1`` has been seen (within a deadline)."""
    consumer = Consumer(
        {"bootstrap.servers": settings.bootstrap_servers, "group.id": f"test-reader-{uuid.uuid4()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in range(settings.partitions)])
    found: list[bytes] = []
    seen: set[int] = set()
    deadline = time.monotonic() + TIMEOUT
    try:
        while seen != set(range(events)):
            assert time.monotonic() < deadline, f"{topic}: only seqs {sorted(seen)} of {session_id} read"
            record = consumer.poll(0.5)
            if record is None or record.error() or record.key() != session_id.encode():
                continue
            found.append(record.value())
            seen.add(decode_event(record.value()).seq)
    finally:
        consumer.close()
    return found


def _spool_bytes(folder: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file())


def _found(raw: list[bytes], blobs: list[bytes]) -> set[bytes]:
    return {needle for needle in raw for blob in blobs if needle in blob}


async def _flushed_by_the_timer(session, turn_index: int, timeout: float = 10) -> None:
    """Poll, with a deadline, until the recorder's timer has taken the turn's newest text (it spools it only
    if its redaction differs from the last one spooled)."""
    deadline = time.monotonic() + timeout
    while session._open[turn_index].dirty:
        assert time.monotonic() < deadline, f"the timer did not flush turn {turn_index} within {timeout} s"
        await asyncio.sleep(0.02)


async def _record(settings, local_id: str) -> tuple[str, bytes, int]:
    """One session: partials flushed by the timer as the card number and email are said, a completed turn
    with a tool call, and a partial left open at the end. Returns the session's key, the spool folder's
    bytes, read before the recorder closes (the spool keeps what it held in its free pages and write-ahead
    log), and the number of events recorded."""
    async with SessionRecorder(settings) as recorder:
        session = await recorder.start_session(local_id, fleet="tests", agent_id="a1")
        said = ""
        for word in f"my card is {CARD} and my mail is {EMAIL} call me on {PHONE} thanks".split(" "):
            said = f"{said} {word}".strip()
            session.update_partial(0, "user", said)
            await _flushed_by_the_timer(session, 0)
        await session.complete_turn(0, "user", said)
        await session.complete_turn(
            1, "agent", "Let me look that up.",
            tool_calls=[{"name": "crm_lookup", "arguments": {"email": EMAIL}, "result": {"card": CARD, "phone": PHONE}}],
        )
        session.update_partial(2, "user", f"one more thing, my card is {CARD}, right?")
        await session.flush_partial()
        assert await session.wait_acknowledged(30)
        spooled = _spool_bytes(Path(settings.spool_dir))
        await session.end("hangup")
    return session.session_id, spooled, session.next_seq


async def test_no_raw_email_card_or_phone_reaches_the_spool_the_topics_or_the_store(pipeline, tmp_path):
    unsealed = {"encryption": "off"}
    redacting = pipeline.settings.model_copy(update={**unsealed, "redaction": "patterns", "spool_dir": str(tmp_path / "redacting")})
    clear = pipeline.settings.model_copy(update={**unsealed, "spool_dir": str(tmp_path / "clear")})

    redacted_id, redacted_spool, redacted_events = await _record(redacting, f"pii-{uuid.uuid4().hex[:8]}")
    clear_id, clear_spool, clear_events = await _record(clear, f"clear-{uuid.uuid4().hex[:8]}")
    for session_id in (redacted_id, clear_id):
        wait_until(lambda: _finalized(pipeline, session_id), timeout=TIMEOUT, what=f"{session_id} finalized")

    turns, payloads = _stored(pipeline, redacted_id)
    said = f"my card is {CARD} and my mail is {EMAIL} call me on {PHONE} thanks"
    assert turns == [
        (0, PatternRedactor()(said), "complete", None),
        (1, "Let me look that up.", "complete",
         [{"name": "crm_lookup", "arguments": {"email": "[EMAIL]"}, "result": {"card": "[CARD]", "phone": "[PHONE]"}}]),
        (2, "one more thing, my card is [CARD], right?", "interrupted", None),
    ]
    assert turns[0][1] == "my card is [CARD] and my mail is [EMAIL] call me on [PHONE] thanks"
    events = _topic_values(pipeline.settings, pipeline.settings.topics.events, redacted_id, redacted_events)
    transcript = _topic_values(pipeline.settings, pipeline.settings.topics.transcript, redacted_id, redacted_events)
    partials = [e for e in events if b'"turn.partial"' in e]
    assert len(partials) >= 10  # the partials flushed as the words came
    assert _found(RAW, [redacted_spool]) == set()
    assert _found(RAW, events) == set()
    assert _found(RAW, transcript) == set()
    assert _found(RAW, [p.encode() for p in payloads]) == set()
    assert _found(RAW, [repr(turns).encode()]) == set()

    # The same session recorded in clear: each place would have held them.
    clear_turns, clear_payloads = _stored(pipeline, clear_id)
    assert clear_turns[0][1] == said
    assert _found(RAW, [clear_spool]) == SAID
    assert _found(RAW, _topic_values(pipeline.settings, pipeline.settings.topics.events, clear_id, clear_events)) == SAID
    assert _found(RAW, _topic_values(pipeline.settings, pipeline.settings.topics.transcript, clear_id, clear_events)) == SAID
    assert _found(RAW, [p.encode() for p in clear_payloads]) == SAID
