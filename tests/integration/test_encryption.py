"""Envelope encryption on the real pipeline: the spool and every topic hold ciphertext of the
content, the store and the API's readers get it back, a writer with a KEK the readers lack is
dead-lettered alone, and plain (pre-encryption) writers keep working beside sealed ones."""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import select

from turnlog.crypto.keys import create_keyring_file, public_key_text
from turnlog.dlq import REASON_HEADER
from turnlog.producers import SessionRecorder, partition_for
from turnlog.schemas import decode_event
from turnlog.schemas.events import TurnCompleted
from turnlog.sinks.tables import session_events, sessions, transcript_turns

from tests.support import partition_records, wait_until

TIMEOUT = 90
#: Words said in the sessions below; none may appear in a topic's or the spool's bytes.
SECRET_WORDS = ("Zanzibar", "Quixotic", "Marmalade", "Obsidian", "Perihelion")


def finalized(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        row = conn.execute(select(sessions).where(sessions.c.id == session_id)).mappings().first()
    return row if row is not None and row["status"] == "finalized" else None


def stored_turns(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(
            select(transcript_turns.c.turn_index, transcript_turns.c.text, transcript_turns.c.status,
                   transcript_turns.c.tool_calls)
            .where(transcript_turns.c.session_id == session_id).order_by(transcript_turns.c.turn_index)
        )]


def topic_bytes(settings, topic):
    """Every committed record of every partition of ``topic``: (key, value, headers)."""
    return [record for p in range(settings.partitions)
            for record in partition_records(settings.bootstrap_servers, topic, p)]


async def record_secret_session(settings, session_id, *, spool_check=None) -> str:
    """Fleet ``tests``'s session ``session_id``, saying every secret word; returns its key."""
    async with SessionRecorder(settings) as recorder:
        assert recorder.encrypted == (settings.keyring_file is not None or settings.kek_public_key is not None)
        session = await recorder.start_session(session_id, fleet="tests", agent_id="a1",
                                               metadata={"caller": f"{SECRET_WORDS[0]} Ltd"})
        session.update_partial(0, "user", f"My code word is {SECRET_WORDS[1]}")
        await session.flush_partial()
        await session.complete_turn(0, "user", f"My code word is {SECRET_WORDS[1]} and {SECRET_WORDS[2]}")
        await session.complete_turn(1, "agent", f"Noted: {SECRET_WORDS[3]}", output_tokens=4,
                                    tool_calls=[{"name": "lookup", "arguments": {"q": SECRET_WORDS[4]},
                                                 "result": {"hit": SECRET_WORDS[4]}}])
        if spool_check is not None:
            spool_check(recorder.spool_path.parent)
        await session.end("hangup")
    return session.session_id


def assert_no_secret_in(blobs, where):
    for blob in blobs:
        for word in SECRET_WORDS:
            assert word.encode() not in blob, f"{word} in clear in {where}"


def spool_bytes(folder: Path) -> list[bytes]:
    return [path.read_bytes() for path in folder.iterdir() if path.is_file()]


async def test_the_spool_and_every_topic_hold_only_ciphertext_and_the_store_reads_the_words(new_pipeline):
    pipeline = new_pipeline(("sequencer", "sink"))
    seen_spools: list[bytes] = []
    session_id = await record_secret_session(pipeline.settings, f"enc-{uuid.uuid4().hex[:8]}",
                                             spool_check=lambda folder: seen_spools.extend(spool_bytes(folder)))
    wait_until(lambda: finalized(pipeline, session_id), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert stored_turns(pipeline, session_id) == [
        (0, f"My code word is {SECRET_WORDS[1]} and {SECRET_WORDS[2]}", "complete", None),
        (1, f"Noted: {SECRET_WORDS[3]}", "complete",
         [{"name": "lookup", "arguments": {"q": SECRET_WORDS[4]}, "result": {"hit": SECRET_WORDS[4]}}]),
    ]
    assert finalized(pipeline, session_id)["metadata"] == {"caller": f"{SECRET_WORDS[0]} Ltd"}
    settings = pipeline.settings
    events = topic_bytes(settings, settings.topics.events)
    transcript = topic_bytes(settings, settings.topics.transcript)
    ours = [value for key, value, _ in events if key == session_id.encode()]
    assert len(ours) == 5 and all(decode_event(v).schema_version == 3 for v in ours if b'"session.ended"' not in v)
    assert_no_secret_in([value for _, value, _ in events], settings.topics.events)
    assert_no_secret_in([value for _, value, _ in transcript], settings.topics.transcript)
    assert seen_spools, "the spool held nothing while the session was open"
    assert_no_secret_in(seen_spools, "the spool")
    assert_no_secret_in(spool_bytes(Path(settings.spool_dir)), "the spool after delivery")
    with pipeline.store.engine.connect() as conn:  # the store's event log holds the opened events
        payloads = conn.execute(select(session_events.c.payload).where(session_events.c.session_id == session_id)
                                .order_by(session_events.c.seq)).scalars().all()
    assert SECRET_WORDS[3] in payloads[3] and '"sealed"' not in "".join(payloads)


async def test_a_writer_whose_kek_the_readers_lack_is_dead_lettered_alone_and_plain_writers_still_work(
    new_pipeline, tmp_path
):
    pipeline = new_pipeline(("sequencer", "sink"))
    settings = pipeline.settings
    stranger = create_keyring_file(tmp_path / "stranger-keyring")
    foreign = settings.model_copy(update={"keyring_file": None, "kek_public_key": public_key_text(stranger.key),
                                          "spool_dir": str(tmp_path / "spool-foreign")})
    plain = settings.model_copy(update={"keyring_file": None, "spool_dir": str(tmp_path / "spool-plain")})
    foreign_id = await record_secret_session(foreign, f"foreign-{uuid.uuid4().hex[:8]}")
    plain_id = await record_secret_session(plain, f"plain-{uuid.uuid4().hex[:8]}")
    sealed_id = await record_secret_session(settings, f"sealed-{uuid.uuid4().hex[:8]}")
    for session_id in (sealed_id, plain_id):  # a deployment migrating to encryption: both kinds are read
        wait_until(lambda sid=session_id: finalized(pipeline, sid), timeout=TIMEOUT, what=f"{session_id} finalized")
        assert stored_turns(pipeline, session_id)[0][1] == f"My code word is {SECRET_WORDS[1]} and {SECRET_WORDS[2]}"

    partition = partition_for(foreign_id, settings.partitions)

    def dead_letters():
        found = [(decode_event(value), dict(headers)) for key, value, headers in
                 partition_records(settings.bootstrap_servers, settings.topics.dlq, partition)
                 if key == foreign_id.encode()]
        return found if len(found) >= 4 else None  # started, partial, two turns: sealed; ended is plain

    letters = wait_until(dead_letters, timeout=TIMEOUT, what=f"{foreign_id}'s sealed records dead-lettered")
    for event, headers in letters:
        reason = headers[REASON_HEADER].decode()
        if isinstance(event, TurnCompleted):
            assert f"KEK {stranger.id}" in reason and foreign_id in reason, reason
        assert not any(word in reason for word in SECRET_WORDS)
    assert stored_turns(pipeline, foreign_id) == []  # nothing of it read as empty text
