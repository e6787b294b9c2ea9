"""Hostile input on the real broker, Postgres and sequencer/sink/API processes, with fleet keys
configured (docs/design.md, "Write-side isolation"): a writer can affect only its own fleet's
sessions, no record can fence a session or rewrite a stored seq with an epoch nobody issued,
records nested or sized past the schema's bounds are refused, and no fleet reads another's words
through the API.

Each hostile record is interleaved with healthy sessions on the same partition; the healthy
sessions must be stored intact and finalized, every service alive, and each hostile record in the
DLQ with its reason (or refused at the recorder). The sequencer's byte bounds (a growing turn
behind a gap, records too large to carry) are tried in test_sequencer_bounds.py, poison for the
sink and analytics in test_poison_records.py, unreadable headers in test_unreadable_headers.py."""

from __future__ import annotations

import uuid

import httpx
import msgspec
import pytest
from confluent_kafka import Producer
from msgspec.structs import replace
from pydantic import SecretStr
from sqlalchemy import select

from turnlog.deploy.processes import stop_all
from turnlog.dlq import REASON_HEADER
from turnlog.ops.erasure import request_erasure
from turnlog.ops.replay import replay_events
from turnlog.producers import InvalidTurnError, SessionNotFoundError, partition_for
from turnlog.schemas import encode_event
from turnlog.schemas.session_keys import session_key
from turnlog.signing import EpochGrant, RecordSigner, issue_epoch_grant
from turnlog.sinks import open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.sinks.tables import sessions, transcript_turns

from tests.integration.conftest import drop_topics, make_pipeline
from tests.integration.test_pipeline import finalized, read_partition, session_row, stored_turns
from tests.support import EventFactory, free_port, recorder_for, wait_until

TIMEOUT = 90
KEYS = {"alpha": "alpha-key-" + "a" * 32, "beta": "beta-key-" + "b" * 32}
GRANT_KEY = "issuer-key-" + "i" * 32


@pytest.fixture(scope="module")
def signed_pipeline(kafka_bootstrap, postgres_databases, tmp_path_factory):
    running = make_pipeline(
        kafka_bootstrap, postgres_databases.create(), tmp_path_factory.mktemp("signed"),
        ("sequencer", "sink", "api"), fleet_keys=KEYS, epoch_grant_key=GRANT_KEY,
        api_tokens={"alpha-token": ["alpha"], "beta-token": ["beta"]}, api_port=free_port(),
    )
    running.wait_ready()
    yield running
    stop_all(running.processes)
    running.store.engine.dispose()
    drop_topics(running.settings)


def fleet_settings(pipeline, fleet):
    """The pipeline's settings as one fleet's agent host has them: its own key only."""
    return pipeline.settings.model_copy(update={"fleet_keys": {fleet: SecretStr(KEYS[fleet])}})


def same_partition_id(pipeline, other: str, prefix: str) -> str:
    """A fresh session id on ``other``'s partition (hostile and healthy records interleave there)."""
    target = partition_for(other, pipeline.settings.partitions)
    while True:
        candidate = f"{prefix}-{uuid.uuid4().hex[:8]}"
        if partition_for(candidate, pipeline.settings.partitions) == target:
            return candidate


def send(pipeline, events, *, fleet=None, grant=None, sign_as=None, partition=None):
    """Produce ``events`` raw, signed with ``fleet``'s key (as ``sign_as`` says it is, if given), or unsigned;
    to ``partition`` if given, else to the session's."""
    producer = Producer({"bootstrap.servers": pipeline.settings.bootstrap_servers, "partitioner": "murmur2_random"})
    for event in events:
        key, value = event.session_id.encode(), encode_event(event)
        headers = None
        if fleet is not None:
            headers = RecordSigner({sign_as or fleet: KEYS[fleet]}).headers(sign_as or fleet, key, value, grant)
        where = {} if partition is None else {"partition": partition}
        producer.produce(pipeline.settings.topics.events, key=key, value=value, headers=headers, **where)
    assert producer.flush(10) == 0


def dlq_reasons(pipeline, session_id, count):
    records = wait_until(
        lambda: (r := read_partition(pipeline, pipeline.settings.topics.dlq, session_id, with_headers=True))
        and len(r) >= count and r,
        timeout=TIMEOUT, what=f"{count} DLQ records of {session_id}",
    )
    return sorted(dict(headers)[REASON_HEADER].decode() for _, headers in records)


def finalized_with_turns(pipeline, session_id, turns):
    """Wait until ``session_id`` is finalized; assert its stored turns are ``turns``
    (``(turn_index, speaker, text, status)``, in order); return its row."""
    row = wait_until(lambda: finalized(pipeline, session_id), timeout=TIMEOUT, what=f"{session_id} finalized")
    assert [tuple(t) for t in stored_turns(pipeline, session_id)] == turns
    return row


def assert_alive(pipeline):
    dead = {name: p.popen.returncode for name, p in pipeline.processes.items() if p.popen.poll() is not None}
    assert not dead, f"services exited: {dead}\n{pipeline.logs()}"


async def test_no_other_fleet_unsigned_writer_or_invented_epoch_can_touch_a_session(signed_pipeline):
    pipeline = signed_pipeline
    local = f"room-{uuid.uuid4().hex[:8]}"
    session_id = session_key("alpha", local)
    forged_id = same_partition_id(pipeline, session_id, "forged")
    unsigned_id = same_partition_id(pipeline, session_id, "unsigned")
    async with recorder_for(fleet_settings(pipeline, "alpha")) as recorder:
        session = await recorder.start_session(local, fleet="alpha", agent_id="a1")
        await session.complete_turn(0, "user", "alpha's first words")
        squatter = EventFactory(session_id)
        # Another fleet writes alpha's session key: its start and its turn.
        send(pipeline, [replace(squatter.started(), fleet="beta")], fleet="beta")
        send(pipeline, [squatter.completed(2, 1, "beta writes into alpha's session")], fleet="beta")
        # beta signs a start that says it is alpha's; an unsigned writer starts a session.
        send(pipeline, [replace(EventFactory(forged_id).started(), fleet="alpha")], fleet="beta")
        send(pipeline, [EventFactory(unsigned_id).started()])
        # alpha's own buggy producer invents an epoch (would fence the session for good).
        send(pipeline, [squatter.partial(3, 1, "fenced?", epoch=2**31 - 1)], fleet="alpha")
        # ... and writes the session on another partition, where another worker could sequence it apart.
        wrong = (partition_for(session_id, pipeline.settings.partitions) + 1) % pipeline.settings.partitions
        send(pipeline, [squatter.partial(3, 1, "elsewhere")], fleet="alpha", partition=wrong)
        await session.complete_turn(1, "agent", "alpha's reply")
        await session.end("done")

    row = finalized_with_turns(pipeline, session_id, [
        (0, "user", "alpha's first words", "complete"),
        (1, "agent", "alpha's reply", "complete"),
    ])
    assert row["fleet"] == "alpha"
    reasons = dlq_reasons(pipeline, session_id, 3)
    assert [r.split(":", 1)[0] for r in reasons] == ["epoch not issued", "foreign fleet", "foreign fleet"]
    assert dlq_reasons(pipeline, forged_id, 1)[0].startswith("forged fleet")
    assert dlq_reasons(pipeline, unsigned_id, 1)[0].startswith("unauthenticated: unsigned")
    assert session_row(pipeline, forged_id) is None and session_row(pipeline, unsigned_id) is None
    [(_, headers)] = wait_until(
        lambda: read_partition(pipeline, pipeline.settings.topics.dlq, session_id, with_headers=True, partition=wrong),
        timeout=TIMEOUT, what="the misrouted record in the DLQ",
    )
    assert dict(headers)[REASON_HEADER].decode().startswith(f"misrouted: {session_id} belongs on partition")
    assert_alive(pipeline)


async def record_crash_and_resume(pipeline, settings, local, *, while_resumed=None):
    """A first recorder says turn 0 of alpha's session ``local`` and stops without ending it; a
    second resumes it, calls ``while_resumed(resumed session)`` if given, says turn 1 and ends it.
    Returns the resumed session's ``(fleet, epoch, next_seq)`` and asserts what the store then holds."""
    session_id = session_key("alpha", local)
    async with recorder_for(settings) as first:
        session = await first.start_session(local, fleet="alpha", agent_id="a1")
        await session.complete_turn(0, "user", "before the crash")
        assert await session.wait_acknowledged(30)
    async with recorder_for(settings) as second:
        resumed = await second.resume(local, fleet="alpha", timeout=60)
        assert resumed.session_id == session_id
        position = (resumed.fleet, resumed.epoch, resumed.next_seq)
        if while_resumed is not None:
            while_resumed(resumed)
        await resumed.complete_turn(1, "agent", "after the resume")
        await resumed.end("done")
    finalized_with_turns(pipeline, session_id, [
        (0, "user", "before the crash", "complete"),
        (1, "agent", "after the resume", "complete"),
    ])
    return position


async def test_a_resumed_epoch_is_admitted_by_its_grant_and_an_old_seq_cannot_rewrite_history(signed_pipeline):
    pipeline = signed_pipeline
    local = f"resumed-{uuid.uuid4().hex[:8]}"
    session_id = session_key("alpha", local)

    def rewrite_history(resumed):
        # A buggy producer holding this epoch's grant re-sends an old seq with other words.
        grant = issue_epoch_grant(GRANT_KEY, EpochGrant("alpha", session_id, resumed.epoch, resumed.next_seq))
        send(pipeline, [EventFactory(session_id).completed(1, 0, "rewritten history", epoch=resumed.epoch)],
             fleet="alpha", grant=grant)

    position = await record_crash_and_resume(
        pipeline, fleet_settings(pipeline, "alpha"), local, while_resumed=rewrite_history
    )
    assert position == ("alpha", 1, 2)
    [reason] = dlq_reasons(pipeline, session_id, 1)
    assert reason.startswith("epoch not issued: seq 1 is below seq 2")
    assert_alive(pipeline)


async def test_a_resume_through_the_api_gets_a_grant_the_sequencer_admits(signed_pipeline):
    """The agent host has its fleet's key and an API token, no database and no grant key."""
    pipeline = signed_pipeline
    local = f"api-resumed-{uuid.uuid4().hex[:8]}"
    agent = fleet_settings(pipeline, "alpha").model_copy(update={
        "api_url": f"http://127.0.0.1:{pipeline.settings.api_port}",
        "api_token": SecretStr("alpha-token"),
        "database_url": SecretStr("postgresql+psycopg://agent:none@127.0.0.1:1/none"),
        "epoch_grant_key": None,
    })
    assert await record_crash_and_resume(pipeline, agent, local) == ("alpha", 1, 2)
    assert read_partition(pipeline, pipeline.settings.topics.dlq, session_key("alpha", local)) == []
    assert_alive(pipeline)


async def test_a_replay_admits_exactly_what_the_sequencer_admitted(signed_pipeline, tmp_path):
    """A store rebuilt from the log with the same keys refuses the same records: another fleet's
    turns, forged starts and unsigned sessions never reach it."""
    pipeline = signed_pipeline
    local = f"replayed-{uuid.uuid4().hex[:8]}"
    session_id = session_key("alpha", local)
    forged_id = same_partition_id(pipeline, session_id, "forged")
    async with recorder_for(fleet_settings(pipeline, "alpha")) as recorder:
        session = await recorder.start_session(local, fleet="alpha", agent_id="a1")
        await session.complete_turn(0, "user", "alpha's words")
        send(pipeline, [EventFactory(session_id).completed(2, 1, "beta's words")], fleet="beta")
        send(pipeline, [replace(EventFactory(forged_id).started(), fleet="alpha")], fleet="beta")
        send(pipeline, [EventFactory(session_id).partial(3, 1, "fenced?", epoch=7)], fleet="alpha")
        await session.end("done")
    wait_until(lambda: finalized(pipeline, session_id), timeout=TIMEOUT, what=f"{session_id} finalized")

    rebuilt = open_store(SecretStr(f"sqlite:///{tmp_path / 'rebuilt.db'}"))
    upgrade_to_head(rebuilt.engine)
    result = replay_events(pipeline.settings, rebuilt, session_ids=[session_id, forged_id])
    with rebuilt.engine.connect() as conn:
        rows = conn.execute(select(sessions.c.id, sessions.c.fleet, sessions.c.status)).all()
        turns = conn.execute(
            select(transcript_turns.c.turn_index, transcript_turns.c.text).where(
                transcript_turns.c.session_id == session_id
            ).order_by(transcript_turns.c.turn_index)
        ).all()
    assert [tuple(r) for r in rows] == [(session_id, "alpha", "finalized")]
    assert [tuple(t) for t in turns] == [(0, "alpha's words")]
    assert result.rejected_reasons == {"foreign fleet": 1, "forged fleet": 1, "epoch not issued": 1}
    rebuilt.engine.dispose()


def nested(depth: int) -> str:
    """A JSON object nested ``depth`` levels deep."""
    return '{"a":' * depth + "1" + "}" * depth


def with_field(event, path: tuple[str, ...], raw_json: str) -> bytes:
    """``event`` encoded, with the value at ``path`` replaced by ``raw_json`` (written as is)."""
    import msgspec

    doc = msgspec.json.decode(encode_event(event))
    target = doc
    for name in path[:-1]:
        target = target[name] if not isinstance(target, list) else target[int(name)]
    target[path[-1]] = "__HOLE__"
    return msgspec.json.encode(doc).replace(b'"__HOLE__"', raw_json.encode())


async def test_values_nested_or_sized_past_the_schema_are_refused_at_the_recorder_and_in_the_pipeline(
    signed_pipeline,
):
    pipeline = signed_pipeline
    local = f"nested-{uuid.uuid4().hex[:8]}"
    session_id = session_key("alpha", local)
    victims = {name: same_partition_id(pipeline, session_id, name) for name in ("meta", "args", "result", "big")}
    alpha = fleet_settings(pipeline, "alpha")
    producer = Producer({"bootstrap.servers": pipeline.settings.bootstrap_servers, "partitioner": "murmur2_random"})
    signer = RecordSigner({"alpha": KEYS["alpha"]})

    def send_raw(sid: str, value: bytes) -> None:
        key = sid.encode()
        producer.produce(pipeline.settings.topics.events, key=key, value=value,
                         headers=signer.headers("alpha", key, value))

    async with recorder_for(alpha) as recorder:
        with pytest.raises(InvalidTurnError):
            await recorder.start_session(victims["meta"], fleet="alpha", agent_id="a1",
                                         metadata=msgspec.json.decode(nested(40)))
        session = await recorder.start_session(local, fleet="alpha", agent_id="a1")
        with pytest.raises(InvalidTurnError):
            await session.complete_turn(0, "agent", "x", tool_calls=[{"name": "t", "arguments": {"a": "b" * 300_000}}])
        await session.complete_turn(0, "user", "healthy words")
        # A buggy producer holding alpha's key sends what the recorder refuses; a ~1,000-deep value
        # used to raise RecursionError wherever it was decoded.
        f = {name: EventFactory(sid) for name, sid in victims.items()}
        send_raw(victims["meta"], with_field(f["meta"].started(), ("metadata",), nested(1000)))
        for name, field in (("args", "arguments"), ("result", "result")):
            send_raw(victims[name], encode_event(replace(f[name].started(), fleet="alpha")))
            call = {"name": "t", "arguments": {}, "result": None}
            event = f[name].completed(1, 0, "calls a tool")
            raw = with_field(replace(event, tool_calls=[]), ("tool_calls",), msgspec.json.encode([call]).decode())
            send_raw(victims[name], raw.replace(f'"{field}":'.encode() + (b"{}" if field == "arguments" else b"null"),
                                                f'"{field}":{nested(1000)}'.encode(), 1))
        send_raw(victims["big"], with_field(replace(f["big"].started(), fleet="alpha"), ("metadata",),
                                            msgspec.json.encode({"blob": "x" * 70_000}).decode()))
        assert producer.flush(10) == 0
        await session.complete_turn(1, "agent", "still recorded")
        await session.end("done")

    finalized_with_turns(pipeline, session_id, [
        (0, "user", "healthy words", "complete"),
        (1, "agent", "still recorded", "complete"),
    ])
    assert dlq_reasons(pipeline, victims["meta"], 1)[0].startswith("invalid:")
    for name in ("args", "result"):
        assert dlq_reasons(pipeline, victims[name], 1)[0].startswith("invalid:")
        assert not stored_turns(pipeline, victims[name])
    assert dlq_reasons(pipeline, victims["big"], 1)[0].startswith("invalid:")
    assert session_row(pipeline, victims["meta"]) is None and session_row(pipeline, victims["big"]) is None
    assert_alive(pipeline)


async def test_no_fleet_reads_another_fleets_words_through_the_api(signed_pipeline):
    pipeline = signed_pipeline
    local = f"private-{uuid.uuid4().hex[:8]}"
    session_id = session_key("alpha", local)
    async with recorder_for(fleet_settings(pipeline, "alpha")) as recorder:
        session = await recorder.start_session(local, fleet="alpha", agent_id="a1")
        await session.complete_turn(0, "user", "alpha only")
        # beta writes alpha's key: its words are refused, and beta's token sees no such session.
        send(pipeline, [replace(EventFactory(session_id).started(), fleet="beta")], fleet="beta")
        send(pipeline, [EventFactory(session_id).completed(2, 1, "beta's words")], fleet="beta")
        await session.end("done")
    wait_until(lambda: finalized(pipeline, session_id), timeout=TIMEOUT, what=f"{session_id} finalized")
    dlq_reasons(pipeline, session_id, 2)

    base = f"http://127.0.0.1:{pipeline.settings.api_port}/api/sessions"
    with httpx.Client(timeout=10) as client:
        def get(path: str, token: str) -> httpx.Response:
            return client.get(f"{base}{path}", headers={"Authorization": f"Bearer {token}"})

        own = get(f"/{session_id}/transcript", "alpha-token")
        assert own.status_code == 200 and "alpha only" in own.text and "beta's words" not in own.text
        for path in (f"/{session_id}", f"/{session_id}/transcript", f"/{session_id}/events"):
            answer = get(path, "beta-token")
            assert answer.status_code == 404 and "alpha only" not in answer.text
        listed = get("?limit=100", "beta-token")
        assert listed.status_code == 200 and session_id not in listed.text


def api_get(pipeline, path: str, token: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{pipeline.settings.api_port}/api/sessions{path}",
                     headers={"Authorization": f"Bearer {token}"}, timeout=10)


async def test_the_same_id_started_by_two_fleets_is_two_sessions_each_read_by_its_own_fleet_only(signed_pipeline):
    pipeline = signed_pipeline
    local = f"shared-room-{uuid.uuid4().hex[:8]}"
    async with (recorder_for(fleet_settings(pipeline, "beta")) as beta,
                recorder_for(fleet_settings(pipeline, "alpha")) as alpha):
        # beta starts the id first; alpha then starts its own session of that id, and loses nothing
        theirs = await beta.start_session(local, fleet="beta", agent_id="b1")
        await theirs.complete_turn(0, "user", "beta's words")
        mine = await alpha.start_session(local, fleet="alpha", agent_id="a1")
        await mine.complete_turn(0, "user", "alpha's words")
        await theirs.end("done")
        await mine.complete_turn(1, "agent", "alpha's reply")
        await mine.end("done")
    assert (mine.session_id, theirs.session_id) == (session_key("alpha", local), session_key("beta", local))
    finalized_with_turns(pipeline, mine.session_id, [
        (0, "user", "alpha's words", "complete"), (1, "agent", "alpha's reply", "complete"),
    ])
    finalized_with_turns(pipeline, theirs.session_id, [(0, "user", "beta's words", "complete")])
    for own, other, token in ((mine, theirs, "alpha-token"), (theirs, mine, "beta-token")):
        answer = api_get(pipeline, f"/{own.session_id}/transcript", token)
        assert answer.status_code == 200, answer.text
        assert [t["text"] for t in answer.json()["turns"]] == [t[2] for t in stored_turns(pipeline, own.session_id)]
        assert api_get(pipeline, f"/{other.session_id}/transcript", token).status_code == 404

    # beta cannot take a key in alpha's namespace before alpha: refused, and alpha's session of it is stored whole
    taken = f"taken-{uuid.uuid4().hex[:8]}"
    squatted = session_key("alpha", taken)
    send(pipeline, [replace(EventFactory(squatted).started(), fleet="beta")], fleet="beta")
    assert dlq_reasons(pipeline, squatted, 1)[0].startswith("foreign fleet: session key")
    async with recorder_for(fleet_settings(pipeline, "alpha")) as alpha:
        session = await alpha.start_session(taken, fleet="alpha", agent_id="a1")
        await session.complete_turn(0, "user", "alpha keeps its id")
        await session.end("done")
    row = finalized_with_turns(pipeline, squatted, [(0, "user", "alpha keeps its id", "complete")])
    assert row["fleet"] == "alpha"
    assert_alive(pipeline)


async def test_a_session_from_before_session_keys_is_resumed_read_replayed_and_forgotten_by_its_bare_id(
    signed_pipeline, tmp_path,
):
    """A store and a log written by the release before session keys: the session's events carry its
    bare id (the Kafka key, and the store's key). Nothing is rewritten; every reader finds it by it."""
    pipeline = signed_pipeline
    bare = f"legacy-{uuid.uuid4().hex[:8]}"
    before = EventFactory(bare)
    send(pipeline, [replace(before.started(), fleet="alpha"), before.completed(1, 0, "said before the upgrade")],
         fleet="alpha")
    wait_until(lambda: stored_turns(pipeline, bare), timeout=TIMEOUT, what=f"{bare} stored")
    async with recorder_for(fleet_settings(pipeline, "beta")) as recorder:
        with pytest.raises(SessionNotFoundError):  # beta's agent with the same id: not beta's session
            await recorder.resume(bare, fleet="beta", timeout=60)
    # alpha's agent (an adapter) resumes it as it starts every session, by its fleet and its id
    async with recorder_for(fleet_settings(pipeline, "alpha")) as recorder:
        resumed = await recorder.resume(bare, fleet="alpha", timeout=60)
        assert (resumed.session_id, resumed.fleet, resumed.next_turn_index) == (bare, "alpha", 1)
        await resumed.complete_turn(1, "agent", "said after it")
        await resumed.end("done")
    finalized_with_turns(pipeline, bare, [
        (0, "A", "said before the upgrade", "complete"), (1, "agent", "said after it", "complete"),
    ])
    assert read_partition(pipeline, pipeline.settings.topics.dlq, bare) == []
    assert api_get(pipeline, f"/{bare}/transcript", "alpha-token").status_code == 200
    assert api_get(pipeline, f"/{bare}/transcript", "beta-token").status_code == 404

    rebuilt = open_store(SecretStr(f"sqlite:///{tmp_path / 'rebuilt.db'}"))
    upgrade_to_head(rebuilt.engine)
    replay_events(pipeline.settings, rebuilt, session_ids=[bare])
    with rebuilt.engine.connect() as conn:
        assert [tuple(r) for r in conn.execute(select(sessions.c.id, sessions.c.fleet, sessions.c.status))] == [
            (bare, "alpha", "finalized")
        ]
    rebuilt.engine.dispose()

    # `turnlog forget --fleet alpha <id>` looks for the stored bare id before alpha's key of it
    outcome = request_erasure(pipeline.settings, pipeline.store, bare, requested_by="cli:ops", fleets=["alpha"],
                              fleet="alpha", unstored=True, wait_seconds=TIMEOUT)
    assert (outcome.session_id, outcome.status) == (bare, "done")
    assert stored_turns(pipeline, bare) == [] and session_row(pipeline, bare) is None
