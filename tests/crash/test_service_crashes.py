"""Real SIGKILLs of real service processes at named fault points (TURNLOG_FAULTS).

Each test runs its own pipeline (own topics, groups and database), kills one
service where a crash matters most, restarts it, and checks the store against
what it must hold: every event exactly once, in order, aggregates once.
"""

from __future__ import annotations

import signal
import threading
import uuid

import pytest
from confluent_kafka import Producer
from sqlalchemy import func, select

from turnlog.ops.audit import fold_events
from turnlog.schemas import decode_event, encode_event
from turnlog.sinks import SourceMessage, open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.sinks.tables import session_events, sink_offsets

from tests.integration.test_pipeline import finalized, logged_payloads, session_row, stored_turns
from tests.support import (
    EventFactory,
    dump_store,
    fenced_batches,
    free_port,
    read_partition,
    signed_event,
    store_content,
    unfinalize,
    wait_until,
)

TIMEOUT = 120


def session_events_of(f, turns=8):
    """One session: start, a partial and a completion per turn, end (2 + 2 * turns events)."""
    events, seq = [f.started()], 1
    for turn in range(turns):
        events.append(f.partial(seq, turn, f"turn {turn} so"))
        events.append(f.completed(seq + 1, turn, f"turn {turn} so far and done", tokens=turn + 1))
        seq += 2
    events.append(f.ended(seq, last_turn=turns - 1, seconds=120.5))
    return events


def produce(settings, sessions_events, *, waves=1):
    """Produce each session's events to the events topic, in ``waves`` flushed one after another."""
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "partitioner": "murmur2_random", "enable.idempotence": True})
    longest = max(len(events) for events in sessions_events.values())
    per_wave = -(-longest // waves)
    for start in range(0, longest, per_wave):
        for events in sessions_events.values():
            for event in events[start : start + per_wave]:
                key, value, headers = signed_event(settings, event)
                producer.produce(settings.topics.events, key=key, value=value, headers=headers)
        assert producer.flush(10) == 0


def died_by_sigkill(pipeline, name):
    process = pipeline.processes[name]
    wait_until(lambda: not process.alive(), timeout=TIMEOUT, what=f"the {name} to hit its fault point")
    assert process.popen.returncode == -9, pipeline.logs()
    pipeline.processes.pop(name).stop()


def expected_turns(events):
    return [tuple(t) for t in [(t.turn_index, t.speaker, t.text, t.status) for t in fold_events(encode_event(e) for e in events).ordered_turns]]


def read_topic(settings, topic):
    return [
        SourceMessage(m.topic(), m.partition(), m.offset(), m.value(), m.key())
        for partition in range(settings.partitions)
        for m in read_partition(settings.bootstrap_servers, topic, partition)
    ]


@pytest.mark.parametrize("point", ["sink.after_write", "sink.after_commit"])
def test_a_sink_killed_at_a_fault_point_leaves_no_partial_batch_and_recovers_to_the_same_store(new_pipeline, tmp_path, point):
    pipeline = new_pipeline(("sequencer",), sink_batch_size=4)  # no finalizer: the sink finalizes
    settings = pipeline.settings
    batches = {f"crash-{i}-{uuid.uuid4().hex[:6]}": None for i in range(3)}
    events = {sid: session_events_of(EventFactory(sid)) for sid in batches}
    produce(settings, events)
    total = sum(len(e) for e in events.values())
    wait_until(lambda: len(read_topic(settings, settings.topics.transcript)) == total, timeout=TIMEOUT, what="the whole transcript")
    pipeline.start("sink", faults=f"{point}=kill@3")
    died_by_sigkill(pipeline, "sink")

    # At the kill: every stored event is covered by the stored offsets and nothing else is (one transaction).
    # Counted in records below the stored offsets: the sequencer's transaction markers take offsets too.
    stored_events, covered = stored_and_covered(pipeline)
    assert covered == stored_events == (8 if point == "sink.after_write" else 12)  # 2 or 3 batches of 4

    pipeline.start("sink")
    for sid in events:
        wait_until(lambda sid=sid: finalized(pipeline, sid), timeout=TIMEOUT, what=f"{sid} finalized after the restart")
        assert [tuple(t) for t in stored_turns(pipeline, sid)] == expected_turns(events[sid])

    # The same transcript applied in one go by an uninterrupted sink: the same store, aggregates included.
    assert store_content(pipeline.store) == reference_store(settings, tmp_path, events)


def stored_and_covered(pipeline):
    """``(events stored, transcript records below the sink's stored offsets)``: records, not offsets,
    since the sequencer's transaction markers take offsets too."""
    settings = pipeline.settings
    with pipeline.store.engine.connect() as conn:
        stored_events = conn.execute(select(func.count()).select_from(session_events)).scalar_one()
        stored_offsets = {(row.topic, row.partition): row.next_offset for row in conn.execute(select(sink_offsets))}
    covered = sum(1 for m in read_topic(settings, settings.topics.transcript)
                  if m.offset < stored_offsets.get((m.topic, m.partition), 0))
    return stored_events, covered


def reference_store(settings, tmp_path, events):
    """The dump of a store the whole transcript was applied to in one batch (which finalizes every session)."""
    reference = open_store(f"sqlite:///{tmp_path / 'reference.db'}")
    upgrade_to_head(reference.engine)
    with reference.engine.begin() as conn:
        result = reference.apply_batch(conn, settings.sink_group, read_topic(settings, settings.topics.transcript))
    assert sorted(result.finalized) == sorted(events)
    try:
        return store_content(reference)
    finally:
        reference.engine.dispose()


def test_a_sink_killed_after_finalizing_in_its_batch_commits_neither_and_finalizes_once_after_restart(new_pipeline, tmp_path):
    pipeline = new_pipeline(("sequencer",), sink_batch_size=4)
    settings = pipeline.settings
    sid = f"finkill-{uuid.uuid4().hex[:6]}"
    events = {sid: session_events_of(EventFactory(sid))}
    produce(settings, events)
    total = len(events[sid])
    wait_until(lambda: len(read_topic(settings, settings.topics.transcript)) == total, timeout=TIMEOUT, what="the whole transcript")
    pipeline.start("sink", faults="sink.after_finalize=kill")
    died_by_sigkill(pipeline, "sink")

    # Killed after the guarded UPDATE, before the commit: the batch holding session.ended is
    # gone with its aggregates and its offsets; nothing says ended, nothing says finalized.
    row = session_row(pipeline, sid)
    assert (row["status"], row["end_seq"], row["turn_count"]) == ("active", None, None)
    stored_events, covered = stored_and_covered(pipeline)
    assert covered == stored_events < total

    pipeline.start("sink")  # re-applies the batch: rows, aggregates and offsets in one transaction again
    wait_until(lambda: finalized(pipeline, sid), timeout=TIMEOUT, what=f"{sid} finalized after the restart")
    assert store_content(pipeline.store) == reference_store(settings, tmp_path, events)
    log = pipeline.processes["sink"].log_path.read_text(errors="replace")
    assert log.count(f"finalized {sid}") == 1


def test_the_same_batch_applied_twice_by_two_sink_processes_gives_an_identical_store(new_pipeline):
    pipeline = new_pipeline(("sequencer", "sink"))
    sid = f"twice-{uuid.uuid4().hex[:6]}"
    events = session_events_of(EventFactory(sid))
    produce(pipeline.settings, {sid: events})
    wait_until(lambda: finalized(pipeline, sid), timeout=TIMEOUT, what="finalized")
    before = dump_store(pipeline.store, skip_columns=())
    # Rewind the sink's stored offsets (as an operator replaying the topic would) and run it again.
    with pipeline.store.engine.begin() as conn:
        conn.execute(sink_offsets.delete())
    pipeline.stop("sink")
    pipeline.start("sink")
    wait_until(lambda: dump_store(pipeline.store, skip_columns=()) == before, timeout=TIMEOUT,
               what="the replayed sink to rewrite the same store")
    # The redelivered session.ended found the session finalized: finalized_at is the first one.
    assert dump_store(pipeline.store, skip_columns=()) == before


def test_a_finalizer_sweep_killed_after_its_update_does_not_double_the_aggregates(new_pipeline):
    pipeline = new_pipeline(("sequencer", "sink"))
    sids = sorted(f"fin-{i}-{uuid.uuid4().hex[:6]}" for i in range(2))
    events = {sid: session_events_of(EventFactory(sid)) for sid in sids}
    produce(pipeline.settings, events)
    for sid in sids:
        wait_until(lambda sid=sid: finalized(pipeline, sid), timeout=TIMEOUT, what=f"{sid} stored")
        unfinalize(pipeline.store, sid)  # as a sink that did not finalize in its batch left them
    pipeline.start("finalizer", faults="finalizer.after_update=kill")
    died_by_sigkill(pipeline, "finalizer")
    first = [finalized(pipeline, sid) for sid in sids]
    assert first[0] is not None and first[1] is None  # the sweep goes in id order: killed after the first
    pipeline.start("finalizer")  # its sweep's guarded UPDATE matches the first session no more
    wait_until(lambda: finalized(pipeline, sids[1]), timeout=TIMEOUT, what="the restarted sweep to finalize the second")
    assert finalized(pipeline, sids[0]) == first[0]  # finalized_at included
    for sid in sids:
        row, folded = finalized(pipeline, sid), fold_events(logged_payloads(pipeline, sid))
        assert (row["turn_count"], row["input_tokens"], row["output_tokens"]) == (folded.turn_count, folded.input_tokens, folded.output_tokens) == (8, 36, 8)
        assert row["duration_seconds"] == folded.duration_seconds == 120.5


def test_a_sequencer_killed_between_emit_and_commit_loses_and_reorders_nothing(new_pipeline):
    pipeline = new_pipeline(("sink",))
    settings = pipeline.settings
    sids = [f"seq-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
    events = {sid: session_events_of(EventFactory(sid), turns=10) for sid in sids}
    pipeline.start("sequencer", faults="sequencer.after_emit=kill@2")
    first_half = {sid: e[: len(e) // 2] for sid, e in events.items()}
    produce(settings, first_half)  # batch 1: its state is stored
    wanted = sum(map(len, first_half.values()))
    wait_until(lambda: len(read_topic(settings, settings.topics.transcript)) >= wanted, timeout=TIMEOUT, what="batch 1 emitted")
    produce(settings, {sid: e[len(e) // 2 :] for sid, e in events.items()}, waves=3)  # batch 2: killed after its emit
    died_by_sigkill(pipeline, "sequencer")
    pipeline.start("sequencer")
    for sid in sids:
        wait_until(lambda sid=sid: finalized(pipeline, sid), timeout=TIMEOUT, what=f"{sid} finalized")
        assert [tuple(t) for t in stored_turns(pipeline, sid)] == expected_turns(events[sid])
        assert fold_events(logged_payloads(pipeline, sid)).seqs == list(range(len(events[sid])))
    # The transcript may repeat events after the crash, but never out of order within a session.
    for sid in sids:
        seqs = [decode_event(m.value).seq for m in read_topic(settings, settings.topics.transcript) if m.key == sid.encode()]
        first_seen = [s for i, s in enumerate(seqs) if s not in seqs[:i]]
        assert first_seen == list(range(len(events[sid])))


def test_scaling_the_sequencer_from_one_worker_to_two_and_back_while_events_flow(new_pipeline):
    from turnlog.deploy.processes import ServiceProcess, turnlog_command

    pipeline = new_pipeline(("sequencer", "sink"))
    settings = pipeline.settings
    sids = [f"scale-{i}-{uuid.uuid4().hex[:6]}" for i in range(6)]
    events = {sid: session_events_of(EventFactory(sid), turns=12) for sid in sids}
    waves = [{sid: e[i::6] for sid, e in events.items()} for i in range(6)]  # never mind order: the sequencer re-orders
    second = None
    try:
        for number, wave in enumerate(waves):
            produce(settings, wave)
            if number == 1:
                second = ServiceProcess("sequencer-2", turnlog_command("sequencer"), settings.as_environment(), pipeline.log_dir / "sequencer-2.log",
                                        ready_path=pipeline.log_dir / "sequencer-2.ready")
                second.wait_ready(TIMEOUT)  # its rebalance completed: it holds partitions now
            if number == 3:
                pipeline.stop("sequencer")  # back to one worker (the second)
        for sid in sids:
            wait_until(lambda sid=sid: finalized(pipeline, sid), timeout=TIMEOUT, what=f"{sid} finalized")
            assert [tuple(t) for t in stored_turns(pipeline, sid)] == expected_turns(events[sid])
            assert fold_events(logged_payloads(pipeline, sid)).seqs == list(range(len(events[sid])))
    finally:
        if second is not None:
            second.stop()


def test_a_paused_sink_that_wakes_after_another_took_over_cannot_undo_its_work(new_pipeline):
    pipeline = new_pipeline(("sequencer",))
    settings = pipeline.settings
    sid = f"paused-{uuid.uuid4().hex[:6]}"
    f = EventFactory(sid)
    # Sink A consumes a batch holding a partial turn, then stalls before writing it ...
    metrics_a = free_port()
    pipeline.start("sink", faults="sink.after_poll=stall:4000", env={"TURNLOG_METRICS_PORT": str(metrics_a)})
    pipeline.wait_ready()
    produce(settings, {sid: [f.started(), f.partial(1, 0, "half of the")]})
    sink_a = pipeline.processes.pop("sink")
    wait_until(lambda: len(read_topic(settings, settings.topics.transcript)) == 2, timeout=TIMEOUT, what="the partial emitted")
    # ... and is SIGSTOPped there, so its group session expires.
    threading.Event().wait(1.0)  # let A's poll return the batch and enter its stall
    sink_a.popen.send_signal(signal.SIGSTOP)
    try:
        pipeline.start("sink")  # sink B takes the partitions and writes the completed turn
        produce(settings, {sid: [f.completed(2, 0, "half of the sentence, completed"), f.ended(3, last_turn=0)]})
        wait_until(lambda: finalized(pipeline, sid), timeout=TIMEOUT, what="sink B stored and the session finalized")
        with pipeline.store.engine.connect() as conn:
            offsets_before = dict(conn.execute(select(sink_offsets.c.partition, sink_offsets.c.next_offset)).all())
    finally:
        sink_a.popen.send_signal(signal.SIGCONT)  # A wakes with its old batch: B's claim fences it
    wait_until(lambda: fenced_batches(metrics_a) >= 1, timeout=TIMEOUT, what="the woken sink A's batch fenced")
    sink_a.stop()
    assert [tuple(t) for t in stored_turns(pipeline, sid)] == [(0, "A", "half of the sentence, completed", "complete")]
    with pipeline.store.engine.connect() as conn:
        offsets_after = dict(conn.execute(select(sink_offsets.c.partition, sink_offsets.c.next_offset)).all())
    assert all(offsets_after[p] >= offset for p, offset in offsets_before.items())
