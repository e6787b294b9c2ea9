"""Forgotten sessions leave the agents' hosts too: a recorder follows the erasure ledger, its spool
drops what it holds of a forgotten session (also what it adopted from a dead recorder), and a
recorder still writing to one gets SessionErasedError. Real broker, real recorder processes."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from turnlog import kafka
from turnlog.metrics import ERASED_RECORDS_SKIPPED
from turnlog.ops.erasure import request_erasure
from turnlog.producers import SessionErasedError, SessionRecorder
from turnlog.producers.erasure_watch import ErasureWatch
from turnlog.schemas.erasure import Erasure
from turnlog.sinks import open_store
from turnlog.sinks.erasure_ledger import publish_erasures

from tests.integration.spooling_agent import EVENTS_PER_SESSION, FLEET, SECRET
from tests.support import partition_records, wait_until

TIMEOUT = 90
ROOT = Path(__file__).resolve().parents[2]
#: A Postgres nobody answers on: request_erasure takes its ledger-only path (the store "away").
STORE_AWAY = "postgresql+psycopg://turnlog:turnlog@127.0.0.1:1/turnlog"


def skipped_in_spool() -> float:
    return ERASED_RECORDS_SKIPPED.labels(component="spool")._value.get()


def events_by_session(settings) -> dict[str, int]:
    """Records of the events topic per session (key), every partition, read to the high watermark."""
    counts: dict[str, int] = {}
    for partition in range(settings.partitions):
        for key, _, _ in partition_records(settings.bootstrap_servers, settings.topics.events, partition):
            counts[key.decode()] = counts.get(key.decode(), 0) + 1
    return counts


def spool_files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}


def assert_private_and_sealed(folder: Path, where: str) -> None:
    """The folder is 0700, every file in it 0600, and no file holds the words said in clear."""
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700, where
    files = spool_files(folder)
    assert {name.rsplit(".", 1)[-1] for name in files} >= {"db", "db-wal", "lock"}, (where, sorted(files))
    for name in files:
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, (where, name)
        assert SECRET.encode() not in files[name], f"{SECRET} in clear in {where}: {name}"


def forget_with_the_store_away(settings, local_id: str) -> str:
    """``turnlog forget --fleet tests <id>``'s path, given the id the agent gave the session: the store
    does not answer, so only the ledger record is written, under the key the fleet's recorder wrote
    the session under. Returns that key."""
    away = open_store(STORE_AWAY)
    try:
        outcome = request_erasure(settings, away, local_id, requested_by="test", fleet=FLEET, wait_seconds=0)
    finally:
        away.engine.dispose()
    assert (outcome.published, outcome.status) == (True, "pending")
    return outcome.session_id


async def test_an_adopted_orphan_spool_never_delivers_a_session_forgotten_while_its_recorder_was_dead(
    transcript, tmp_path
):
    settings, _ = transcript
    forgotten_local, kept_local = (f"{kind}-{uuid.uuid4().hex[:8]}" for kind in ("forgotten", "kept"))
    spool_dir = Path(settings.spool_dir)
    # A recorder whose broker is out of reach: everything it records stays in its spool.
    env = {**os.environ, **settings.as_environment(), "TURNLOG_BOOTSTRAP_SERVERS": "127.0.0.1:1",
           "TURNLOG_ACK_WAIT_SECONDS": "0.2"}
    agent = subprocess.Popen([sys.executable, "-m", "tests.integration.spooling_agent", forgotten_local, kept_local],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = agent.stdout.readline()
        assert line, agent.stderr.read()[-3000:]
        report = json.loads(line)
        assert report["spooled"] == 2 * EVENTS_PER_SESSION
        forgotten_id, kept_id = report["sessions"]
        assert_private_and_sealed(spool_dir, "the live recorder's spool")
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait(30)
    assert agent.returncode == -signal.SIGKILL
    assert Path(report["spool"]).exists()  # the orphan: database, -wal, -shm and lock left behind
    assert_private_and_sealed(spool_dir, "the dead recorder's spool")

    assert forget_with_the_store_away(settings, forgotten_local) == forgotten_id

    before = skipped_in_spool()
    async with SessionRecorder(settings) as recorder:  # adopts the orphan at start
        assert not Path(report["spool"]).exists()
        assert_private_and_sealed(spool_dir, "the adopting recorder's spool")
        wait_until(lambda: recorder.spooled_events() == 0, timeout=TIMEOUT,
                   what="the kept session delivered and the forgotten one dropped")
        assert skipped_in_spool() - before == EVENTS_PER_SESSION
        assert recorder.spooled_events(forgotten_id) == 0
    delivered = events_by_session(settings)
    assert delivered.get(kept_id) == EVENTS_PER_SESSION
    assert forgotten_id not in delivered, delivered
    assert not any(SECRET.encode() in blob for blob in spool_files(spool_dir).values())


async def test_a_live_recorder_of_a_forgotten_session_gets_session_erased_error_and_drops_its_spool(transcript):
    settings, _ = transcript
    forgotten_local = f"live-{uuid.uuid4().hex[:8]}"
    async with SessionRecorder(settings) as recorder:
        forgotten = await recorder.start_session(forgotten_local, fleet=FLEET, agent_id="a")
        kept = await recorder.start_session(f"other-{uuid.uuid4().hex[:8]}", fleet=FLEET, agent_id="a")
        await forgotten.complete_turn(0, "user", f"I climbed {SECRET}")
        forgotten.update_partial(1, "agent", "Which route did")

        assert forget_with_the_store_away(settings, forgotten_local) == forgotten.session_id

        turn = 1
        deadline = time.monotonic() + TIMEOUT
        while True:  # writes go on as the agent's would, until the recorder has read the ledger
            try:  # the ledger may be read between any two calls: each of them may be the first to refuse
                forgotten.update_partial(turn, "agent", f"Which route did you take, {turn}?")
                await forgotten.flush_partial()
                assert time.monotonic() < deadline, "no SessionErasedError within the deadline"
                await forgotten.complete_turn(turn, "agent", f"Which route did you take, {turn}?")
            except SessionErasedError as e:
                assert e.session_id == forgotten.session_id and SECRET not in str(e)
                break
            turn += 1
        assert forgotten.erased
        with pytest.raises(SessionErasedError):
            forgotten.update_partial(turn + 1, "user", "the Machame route")
        with pytest.raises(SessionErasedError):
            await forgotten.complete_turn(turn + 1, "user", "the Machame route")
        with pytest.raises(SessionErasedError):
            await forgotten.flush_partial()
        with pytest.raises(SessionErasedError):
            await forgotten.end("hangup")
        with pytest.raises(SessionErasedError):  # the drainer refuses the id itself
            await recorder.start_session(forgotten_local, fleet=FLEET, agent_id="a")
        assert recorder.spooled_events(forgotten.session_id) == 0
        # The other session is untouched.
        await kept.complete_turn(0, "user", "hello")
        await kept.end("hangup")
        assert await kept.wait_acknowledged(TIMEOUT)


def test_the_watch_reports_only_relevant_records_follows_new_ones_and_a_check_reads_the_ledger_again(transcript):
    settings, _ = transcript
    ids = [f"w{i}-{uuid.uuid4().hex[:8]}" for i in range(4)]
    relevant = {ids[0]}
    seen: list[str] = []

    def ledger(session_id: str) -> Erasure:
        return Erasure(session_id=session_id, fleet="tests", requested_by="test", requested_at=dt.datetime.now(dt.UTC))

    producer = kafka.producer(settings, client_id="test-ledger")
    assert len(publish_erasures(producer, settings, [ledger(ids[0]), ledger(ids[1])], timeout=30)) == 2
    watch = ErasureWatch(settings, relevant=lambda sid: sid in relevant, on_erased=lambda es: seen.extend(
        e.session_id for e in es))
    first = watch.check({ids[0]})  # asked before start: answered by the first pass
    watch.start()
    try:
        first.result(timeout=TIMEOUT)
        assert watch.caught_up and seen == [ids[0]]  # ids[1] read, not kept: it does not matter here

        relevant.add(ids[2])  # a record written after the session mattered: followed
        assert publish_erasures(producer, settings, [ledger(ids[2])], timeout=30) == [(ids[2], "tests")]
        wait_until(lambda: ids[2] in seen, timeout=TIMEOUT, what="a new ledger record followed")

        relevant.add(ids[1])  # mattering only now (an orphan adopted late): its old record is read again
        again = watch.check({ids[1]})
        again.result(timeout=TIMEOUT)
        assert ids[1] in seen and ids[3] not in seen
    finally:
        watch.close()
    assert watch.check({ids[3]}).cancelled()


def test_a_missing_ledger_topic_is_an_empty_ledger(transcript):
    settings, _ = transcript
    missing = settings.model_copy(update={"topic_prefix": f"absent-{uuid.uuid4().hex[:8]}"})
    watch = ErasureWatch(missing, relevant=lambda sid: True, on_erased=lambda es: None)
    check = watch.check({"anything"})
    watch.start()
    try:
        assert check.result(timeout=TIMEOUT) is None and watch.caught_up
    except concurrent.futures.TimeoutError:
        raise AssertionError("a missing ledger held the check") from None
    finally:
        watch.close()
