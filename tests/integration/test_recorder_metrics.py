"""The recorder's gauges on the real broker: its spool's capacity, and the sessions it records
(started +1; ended, or still open at close, -1)."""

from __future__ import annotations

import uuid

from turnlog import metrics
from turnlog.producers import SessionRecorder


def sessions_open() -> float:
    return metrics.RECORDER_SESSIONS_OPEN._value.get()


async def test_the_recorder_counts_its_open_sessions_and_publishes_its_spool_capacity(transcript):
    settings, _ = transcript
    settings = settings.model_copy(update={"spool_max_bytes": 12_345_678})
    before = sessions_open()
    recorder = SessionRecorder(settings)
    await recorder.start()
    try:
        assert metrics.SPOOL_MAX_BYTES._value.get() == 12_345_678
        first = await recorder.start_session(f"m-{uuid.uuid4().hex[:8]}", fleet="tests", agent_id="a1")
        await recorder.start_session(f"m-{uuid.uuid4().hex[:8]}", fleet="tests", agent_id="a1")
        assert sessions_open() == before + 2
        await first.complete_turn(0, "user", "hello")
        await first.end("hangup")
        assert sessions_open() == before + 1
    finally:
        await recorder.close()
    assert sessions_open() == before  # the one still open is no longer recorded here
