"""Erasures are bound to their fleet and signed (docs/design.md, "Encryption and erasure"), on the
real broker, Postgres, sequencer and sink: fleet A's erasure of an id the store does not hold
erases A's key of it and leaves fleet B's session of that id (another key) alone, B can then
forget its own; an unsigned or forged
ledger record, or one naming another fleet than the stored session's, goes to the DLQ and
changes nothing."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from confluent_kafka import Producer
from sqlalchemy import select

from turnlog.crypto.ledger_signatures import LedgerSigner, new_issuer_key
from turnlog.dlq import REASON_HEADER, reason_class
from turnlog.ops.erasure import request_erasure
from turnlog.producers import partition_for
from turnlog.schemas.erasure import Erasure, encode_erasure
from turnlog.schemas.session_keys import session_key
from turnlog.sinks.erasure_ledger import ledger_key
from turnlog.sinks.tables import erasures

from tests.integration.test_pipeline import finalized, stored_turns
from tests.support import partition_records, recorder_for, wait_until

TIMEOUT = 90
PRIVATE, PUBLIC = new_issuer_key()


@pytest.fixture(scope="module")
def signed_ledger(kafka_bootstrap, postgres_databases, tmp_path_factory):
    from tests.integration.conftest import pipelines

    factory = pipelines(kafka_bootstrap, postgres_databases, tmp_path_factory.mktemp("ledger"))
    make = next(factory)
    running = make(("sequencer", "sink"), erasure_issuer="ops", erasure_issuer_key=PRIVATE,
                   erasure_issuers={"ops": PUBLIC})
    running.wait_ready()
    yield running
    next(factory, None)


async def record(pipeline, session_id: str, fleet: str, words: tuple[str, ...]) -> str:
    """Fleet ``fleet``'s session ``session_id``, one turn per word, once finalized; returns its key."""
    async with recorder_for(pipeline.settings) as recorder:
        session = await recorder.start_session(session_id, fleet=fleet, agent_id="agent")
        for index, text in enumerate(words):
            await session.complete_turn(index, "user", text)
        await session.end("completed")
    key = session.session_id
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{key} finalized")
    return key


def erasure_rows(pipeline, session_id: str) -> dict[str, tuple[str, bool]]:
    """``{fleet: (requested_by, applied)}`` of the session key's erasure rows."""
    with pipeline.store.engine.connect() as conn:
        rows = conn.execute(select(erasures).where(erasures.c.session_id == session_id)).mappings().all()
    return {row["fleet"]: (row["requested_by"], row["completed_at"] is not None) for row in rows}


async def test_one_fleets_erasure_of_an_id_leaves_another_fleets_session_of_that_id_alone(signed_ledger):
    pipeline = signed_ledger
    session_id = f"room-{uuid.uuid4().hex[:8]}"
    # Fleet A forgets an id the store does not hold (its session is only in spools or in flight):
    # the erasure is of A's key of the id.
    asked = request_erasure(pipeline.settings, pipeline.store, session_id, requested_by="cli:alice",
                            fleet="fleet-a", unstored=True, wait_seconds=TIMEOUT)
    a_key = session_key("fleet-a", session_id)
    assert (asked.session_id, asked.status, asked.requested_by) == (a_key, "done", "ops:cli:alice")

    b_key = await record(pipeline, session_id, "fleet-b", ("hello", "it is fleet b"))
    assert b_key == session_key("fleet-b", session_id)
    assert [t.text for t in stored_turns(pipeline, b_key)] == ["hello", "it is fleet b"]
    with pipeline.store.reading() as reads:
        assert reads.forgotten_among([b_key]) == set()
        assert reads.erasure_state(b_key) is None  # of no fleet
        assert reads.erasure_state(a_key, ["fleet-a"]).fleet == "fleet-a"
    assert erasure_rows(pipeline, a_key) == {"fleet-a": ("ops:cli:alice", True)}
    assert erasure_rows(pipeline, b_key) == {}

    # Fleet B forgets its own session of that id: an erasure row of its own key, A's left as it was.
    mine = request_erasure(pipeline.settings, pipeline.store, b_key, requested_by="api:beta",
                           fleets=["fleet-b"], wait_seconds=TIMEOUT)
    assert (mine.session_id, mine.status, mine.fleet) == (b_key, "done", "fleet-b")
    assert stored_turns(pipeline, b_key) == []
    assert erasure_rows(pipeline, b_key) == {"fleet-b": ("ops:api:beta", True)}
    assert erasure_rows(pipeline, a_key) == {"fleet-a": ("ops:cli:alice", True)}


async def test_an_unsigned_forged_or_foreign_fleet_ledger_record_goes_to_the_dlq_and_changes_nothing(signed_ledger):
    pipeline = signed_ledger
    session_id = await record(pipeline, f"kept-{uuid.uuid4().hex[:8]}", "fleet-b", ("these words stay",))
    partition = partition_for(session_id, pipeline.settings.partitions)
    intruder = LedgerSigner("ops", new_issuer_key()[0])
    issuer = LedgerSigner("ops", PRIVATE)

    def ledger(fleet: str, requested_by: str) -> tuple[bytes, bytes]:
        erasure = Erasure(session_id=session_id, fleet=fleet, requested_by=requested_by,
                          requested_at=dt.datetime.now(dt.UTC))
        return ledger_key(erasure), encode_erasure(erasure)

    unsigned = ledger("fleet-b", "ops:cli:mallory")
    forged = ledger("fleet-b", "ops:cli:mallory")
    foreign = ledger("fleet-a", "ops:cli:alice")  # signed by the issuer, but names fleet A for fleet B's session
    producer = Producer({"bootstrap.servers": pipeline.settings.bootstrap_servers})
    for (key, value), headers in ((unsigned, None), (forged, intruder.headers(*forged)),
                                  (foreign, issuer.headers(*foreign))):
        producer.produce(pipeline.settings.topics.erasures, key=key, value=value, headers=headers,
                         partition=partition)
    assert producer.flush(10) == 0

    def dead_letters() -> list[str]:
        records = partition_records(pipeline.settings.bootstrap_servers, pipeline.settings.topics.dlq, partition)
        return [reason_class(dict(headers or ())[REASON_HEADER].decode()) for key, _, headers in records
                if key is not None and key.endswith(session_id.encode())]

    wait_until(lambda: len(dead_letters()) == 3, timeout=TIMEOUT, what="three ledger records in the DLQ")
    assert sorted(dead_letters()) == ["foreign fleet", "unauthenticated", "unauthenticated"]
    assert [t.text for t in stored_turns(pipeline, session_id)] == ["these words stay"]
    assert erasure_rows(pipeline, session_id) == {}  # the foreign one was refused, not recorded
