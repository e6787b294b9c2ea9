"""The sequencer across restarts and rebalances under load (issue: Faust's record
drop at recovery completion, faust-streaming#596; ``stream_processors/recovery.py``).

Two facts are checked on real processes:

- no offset is skipped: the sequencer's tripwire
  (``turnlog_sequencer_offset_jumps_total``, read from its metrics endpoint)
  stays 0, so every record from the group's committed offset on reached the
  sequencer, in order; Faust commits only processed (acked) records, so its
  committed offset never passes an unprocessed one;
- nothing stalls: the group's committed offsets reach the end of every
  partition after each restart, and every session is complete downstream.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import httpx
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from turnlog.deploy.processes import ServiceProcess, turnlog_command
from turnlog.ops.audit import fold_events
from turnlog.schemas import decode_event

from tests.crash.test_service_crashes import expected_turns, read_topic, session_events_of
from tests.integration.test_pipeline import finalized, logged_payloads, stored_turns
from tests.support import EventFactory, free_port, signed_event, wait_until

TIMEOUT = 180
RESTARTS = 4
STARTS_AGAIN = 6


class Sequencer:
    """A sequencer worker process with its own metrics endpoint."""

    def __init__(self, pipeline, name: str) -> None:
        self.port = free_port()
        env = {**pipeline.settings.as_environment(), "TURNLOG_METRICS_PORT": str(self.port)}
        self.process = ServiceProcess(name, turnlog_command("sequencer"), env, pipeline.log_dir / f"{name}.log")

    def offset_jumps(self) -> float:
        """The tripwire's value, from the metrics endpoint (Prometheus text, parsed)."""
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            if family.name == "turnlog_sequencer_offset_jumps":
                return sum(sample.value for sample in family.samples if sample.name.endswith("_total"))
        raise AssertionError("the sequencer does not export turnlog_sequencer_offset_jumps_total")


def _positions(settings) -> tuple[dict[int, int], dict[int, int]]:
    """``(committed, end)`` offsets of the sequencer's group on the events topic, per partition."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": settings.sequencer_group, "enable.auto.commit": False})
    try:
        tps = [TopicPartition(settings.topics.events, p) for p in range(settings.partitions)]
        committed = {tp.partition: max(tp.offset, 0) for tp in consumer.committed(tps, timeout=10)}
        end = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in tps}
        return committed, end
    finally:
        consumer.close()


def _caught_up(settings) -> bool:
    committed, end = _positions(settings)
    return committed == end


def _produce(settings, sessions: dict[str, list]) -> int:
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "partitioner": "murmur2_random", "enable.idempotence": True, "linger.ms": 20})
    count = 0
    for events in sessions.values():
        for event in events:
            while True:
                try:
                    key, value, headers = signed_event(settings, event)
                    producer.produce(settings.topics.events, key=key, value=value, headers=headers)
                    break
                except BufferError:
                    producer.poll(0.1)
            count += 1
    assert producer.flush(30) == 0
    return count


def _first_seen_seqs(settings) -> dict[bytes, list[int]]:
    seen: dict[bytes, list[int]] = {}
    for message in read_topic(settings, settings.topics.transcript):
        seqs = seen.setdefault(message.key, [])
        seq = decode_event(message.value).seq
        if seq not in seqs:
            seqs.append(seq)
    return seen


def test_restarting_the_sequencer_with_a_changelog_restore_under_a_backlog_skips_no_offset(new_pipeline):
    pipeline = new_pipeline(())
    settings = pipeline.settings
    sessions: dict[str, list] = {}
    jumps: list[float] = []
    for restart in range(RESTARTS):
        # A backlog waits while no sequencer runs; from the second start on, the
        # changelog holds every earlier session's state, so the start restores it first.
        ids = [f"r{restart}-{i}-{uuid.uuid4().hex[:6]}" for i in range(120)]
        backlog = {sid: session_events_of(EventFactory(sid), turns=40) for sid in ids}
        sessions.update(backlog)
        part_way = sum(_positions(settings)[0].values())
        part_way += _produce(settings, backlog) * 0.4
        worker = Sequencer(pipeline, f"sequencer-{restart}")
        try:
            if restart % 2:  # SIGKILL mid-backlog, then start again: a restore with records in flight
                wait_until(
                    lambda: sum(_positions(settings)[0].values()) > part_way,
                    timeout=TIMEOUT, what="the sequencer part way through its backlog",
                )
                jumps.append(worker.offset_jumps())
                worker.process.kill()
                worker = Sequencer(pipeline, f"sequencer-{restart}b")
            wait_until(lambda: _caught_up(settings), timeout=TIMEOUT, what="the sequencer's committed offsets at the end of every partition")
            jumps.append(worker.offset_jumps())
        finally:
            worker.process.kill()
            worker.process.stop()
    assert jumps == [0.0] * len(jumps), f"offsets skipped at recovery: {jumps}"
    seen = _first_seen_seqs(settings)
    for session_id, events in sessions.items():
        assert seen.get(session_id.encode()) == list(range(len(events))), session_id

    # The states restored from the changelog are the ones written: a session of the
    # first start, sent again in full, is all duplicates to a freshly started worker.
    first = next(iter(sessions))
    emitted_before = sum(1 for m in read_topic(settings, settings.topics.transcript) if m.key == first.encode())
    _produce(settings, {first: sessions[first]})
    worker = Sequencer(pipeline, "sequencer-last")
    try:
        wait_until(lambda: _caught_up(settings), timeout=TIMEOUT, what="the re-sent session consumed")
    finally:
        worker.process.stop()
    assert sum(1 for m in read_topic(settings, settings.topics.transcript) if m.key == first.encode()) == emitted_before


def test_a_sequencer_started_again_and_again_on_a_restored_changelog_processes_what_waits(new_pipeline):
    """Faust's fetch of paused partitions (``stream_processors/fetching.py``): at
    the end of a restore, records of a stream partition drained while it was
    still paused were dropped, and the worker never processed them (about one
    start in twenty under load). Each start here restores every session's state
    and finds one session's records waiting; each must reach the committed offset."""
    pipeline = new_pipeline(())
    settings = pipeline.settings
    ids = [f"again-{i}-{uuid.uuid4().hex[:6]}" for i in range(60)]
    sessions = {sid: session_events_of(EventFactory(sid), turns=20) for sid in ids}
    _produce(settings, sessions)
    worker = Sequencer(pipeline, "sequencer-first")
    try:
        wait_until(lambda: _caught_up(settings), timeout=TIMEOUT, what="the first backlog consumed")
    finally:
        worker.process.kill()
    for start in range(STARTS_AGAIN):
        waiting = ids[start % len(ids)]
        _produce(settings, {waiting: sessions[waiting]})  # all duplicates: acked, never emitted
        worker = Sequencer(pipeline, f"sequencer-again-{start}")
        try:
            wait_until(lambda: _caught_up(settings), timeout=TIMEOUT, what=f"start {start}: the waiting records consumed")
            assert worker.offset_jumps() == 0.0
        finally:
            worker.process.kill()
    first_seen = _first_seen_seqs(settings)
    for session_id, events in sessions.items():
        assert first_seen.get(session_id.encode()) == list(range(len(events))), session_id


class _Agents:
    """Sessions sent turn by turn from a thread, paced, until told to end them."""

    def __init__(self, settings, count: int) -> None:
        self.settings = settings
        self.sent: dict[str, list] = {f"scale-{i}-{uuid.uuid4().hex[:6]}": [] for i in range(count)}
        self._ending = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def start(self) -> _Agents:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            producer = Producer({"bootstrap.servers": self.settings.bootstrap_servers, "partitioner": "murmur2_random", "enable.idempotence": True})
            factories = {sid: EventFactory(sid) for sid in self.sent}

            def send(sid: str, event) -> None:
                key, value, headers = signed_event(self.settings, event)
                producer.produce(self.settings.topics.events, key=key, value=value, headers=headers)
                self.sent[sid].append(event)

            for sid, f in factories.items():
                send(sid, f.started())
            turn = 0
            while not self._ending.is_set():
                for sid, f in factories.items():
                    seq = len(self.sent[sid])
                    send(sid, f.partial(seq, turn, f"turn {turn} so"))
                    send(sid, f.completed(seq + 1, turn, f"turn {turn} so far and done", tokens=1))
                producer.poll(0)
                turn += 1
                self._ending.wait(0.05)  # the agents' pace: a round of turns every 50 ms, until told to end
            for sid, f in factories.items():
                send(sid, f.ended(len(self.sent[sid]), last_turn=turn - 1))
            assert producer.flush(30) == 0
        except BaseException as e:  # surfaced by end()
            self.error = e

    def end(self) -> None:
        self._ending.set()
        self._thread.join(60)
        assert self.error is None, self.error


def _members(settings) -> int:
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    [future] = admin.describe_consumer_groups([settings.sequencer_group]).values()
    group = future.result(timeout=10)
    assigned = [m for m in group.members if m.assignment and m.assignment.topic_partitions]
    return len(assigned) if str(group.state).endswith("STABLE") else -1


def _until(probe: Callable[[], bool], what: str) -> None:
    wait_until(probe, timeout=TIMEOUT, what=what)


def test_scaling_the_sequencer_one_two_one_while_agents_keep_sending_finalizes_every_session(new_pipeline):
    pipeline = new_pipeline(("sink", "finalizer"))
    settings = pipeline.settings
    workers = [Sequencer(pipeline, "sequencer-first")]
    jumps: list[float] = []
    agents: _Agents | None = None
    try:
        _until(lambda: _members(settings) == 1, "one sequencer consuming")
        for cycle in range(3):
            # Each cycle takes over partitions whose table state the earlier cycles wrote:
            # the new worker restores it from the changelog while the agents keep sending.
            agents = _Agents(settings, count=24).start()
            workers.append(Sequencer(pipeline, f"sequencer-{cycle}"))  # 1 -> 2
            _until(lambda: _members(settings) == 2, "two sequencers sharing the partitions")
            leaving = workers.pop(0)
            jumps.append(leaving.offset_jumps())
            leaving.process.stop()  # 2 -> 1
            _until(lambda: _members(settings) == 1, "one sequencer left")
            agents.end()
            for session_id, events in agents.sent.items():
                _until(lambda sid=session_id: finalized(pipeline, sid) is not None, f"cycle {cycle}: {session_id} finalized")
                assert [tuple(t) for t in stored_turns(pipeline, session_id)] == expected_turns(events)
                assert fold_events(logged_payloads(pipeline, session_id)).seqs == list(range(len(events)))
        _until(lambda: _caught_up(settings), "the sequencer's committed offsets at the end of every partition")
        jumps.append(workers[0].offset_jumps())
    finally:
        if agents is not None:
            agents._ending.set()
        for worker in workers:
            worker.process.stop()
    assert jumps == [0.0] * len(jumps), f"offsets skipped at a rebalance: {jumps}"
