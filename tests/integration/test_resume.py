"""The resume barrier on the real broker and Postgres."""

from __future__ import annotations

import uuid

import pytest

from turnlog.producers import ResumeBarrierTimeout, SessionClosedError

from tests.integration.test_pipeline import finalized, stored_turns
from tests.support import recorder_for, wait_until

TIMEOUT = 90


@pytest.fixture
def pipeline_without_sink(new_pipeline):
    pipeline = new_pipeline(("sequencer", "finalizer"))
    pipeline.wait_ready()  # the barrier's short timeout below is about the sink, not a slow sequencer start
    return pipeline


async def test_a_resumed_agent_does_not_overwrite_its_predecessors_in_flight_turn(pipeline_without_sink):
    pipeline = pipeline_without_sink
    # The predecessor's turns are acknowledged by the broker, but no sink runs:
    # they are still in flight, nowhere in the store.
    predecessor = recorder_for(pipeline.settings)
    await predecessor.start()
    session = await predecessor.start_session(f"resume-{uuid.uuid4().hex[:8]}", fleet="tests", agent_id="first")
    session_id = session.session_id
    for index, text in enumerate(["zero", "one", "the last completed turn"]):
        await session.complete_turn(index, "agent", text)
    session.update_partial(3, "user", "half of a")
    await session.flush_partial()
    # The predecessor dies here (no end, no close).

    async with recorder_for(pipeline.settings) as successor:
        with pytest.raises(ResumeBarrierTimeout, match="sink"):
            await successor.resume(session_id, timeout=3)
        pipeline.start("sink")
        resumed = await successor.resume(session_id, timeout=TIMEOUT)
        assert (resumed.epoch, resumed.next_seq, resumed.next_turn_index) == (1, 5, 4)
        # The conversation so far, to rebuild the agent's context from.
        assert [(t.turn_index, t.speaker, t.text, t.status) for t in resumed.turns] == [
            (0, "agent", "zero", "complete"),
            (1, "agent", "one", "complete"),
            (2, "agent", "the last completed turn", "complete"),
            (3, "user", "half of a", "partial"),
        ]
        await resumed.complete_turn(4, "user", "half of a sentence, said again")
        await resumed.end("completed")

    row = wait_until(lambda: finalized(pipeline, session_id), timeout=TIMEOUT, what="the resumed session finalized")
    assert [tuple(t) for t in stored_turns(pipeline, session_id)] == [
        (0, "agent", "zero", "complete"),
        (1, "agent", "one", "complete"),
        (2, "agent", "the last completed turn", "complete"),
        (3, "user", "half of a", "interrupted"),
        (4, "user", "half of a sentence, said again", "complete"),
    ]
    assert (row["epoch"], row["turn_count"], row["interrupted_turn_count"]) == (1, 5, 1)
    await predecessor.close()

    async with recorder_for(pipeline.settings) as late:
        with pytest.raises(SessionClosedError):
            await late.resume(session_id, timeout=TIMEOUT)


