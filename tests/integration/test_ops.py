"""``GET /api/ops`` on the real pipeline (broker, Postgres, sequencer and sink processes):
the sink's lag per partition is 0 while it runs, grows while it is stopped and turns
arrive (records and seconds), and is back to 0 once it runs again; throughput and
sessions open follow."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from turnlog.api.app import create_app
from turnlog.producers import SessionRecorder

from tests.support import wait_until

pytestmark = pytest.mark.integration

TOKEN = "ops-token"
TIMEOUT = 90


def sink_rows(figures: dict[str, Any], pipeline) -> list[dict[str, Any]]:
    """The sink group's lag rows on the transcript topic."""
    transcript = pipeline.settings.topics.transcript
    return [row for row in figures["lag"]["partitions"]
            if row["group"] == pipeline.settings.sink_group and row["topic"] == transcript]


async def test_api_ops_shows_the_sink_lag_grow_while_it_is_stopped_and_go_back_to_zero(new_pipeline):
    pipeline = new_pipeline(("sequencer", "sink"))
    pipeline.wait_ready()
    settings = pipeline.settings.model_copy(update={"api_tokens": {TOKEN: ["*"]}, "ops_refresh_seconds": 0.5})
    seen_rates: list[float] = []

    def figures(client: TestClient) -> dict[str, Any]:
        answer = client.get("/api/ops", headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        seen_rates.extend(t["records_per_second"] for t in body["throughput"]["topics"]
                          if t["topic"] == pipeline.settings.topics.events and t["records_per_second"])
        return body

    session_id = f"ops-{uuid.uuid4().hex[:8]}"
    with TestClient(create_app(settings, pipeline.store, live=False)) as client:
        async with SessionRecorder(pipeline.settings) as recorder:
            session = await recorder.start_session(session_id, fleet="fleet-ops", agent_id="agent-1")
            await session.complete_turn(0, "user", "first")

            # Running: every transcript partition the sink has stored an offset for is caught up.
            caught_up = wait_until(
                lambda: (f := figures(client)) and f["sessions_open"]["count"] == 1 and (rows := sink_rows(f, pipeline))
                and all(r["records"] == 0 for r in rows) and rows,
                timeout=TIMEOUT, what="the sink's lag at 0 with the session open",
            )
            assert {r["partition"] for r in caught_up} <= set(range(pipeline.settings.partitions))

            pipeline.stop("sink")
            for index in range(1, 6):
                await session.complete_turn(index, "agent" if index % 2 else "user", f"turn {index}")
            behind = wait_until(
                lambda: [r for r in sink_rows(figures(client), pipeline) if r["records"] >= 5],
                timeout=TIMEOUT, what="the stopped sink's lag to show the five new turns",
            )
            # One session: all its records on one partition, the oldest unprocessed one some time ago.
            assert len(behind) == 1 and behind[0]["end"] - behind[0]["committed"] >= 5
            older = wait_until(
                lambda: [r for r in sink_rows(figures(client), pipeline)
                         if r["partition"] == behind[0]["partition"] and (r["seconds"] or 0) > 0],
                timeout=TIMEOUT, what="the stopped sink's lag in seconds",
            )
            assert older[0]["records"] >= 5

            pipeline.start("sink")
            await session.end("completed")
            wait_until(
                lambda: (f := figures(client)) and f["sessions_open"]["count"] == 0
                and all(r["records"] == 0 and r["seconds"] == 0 for r in sink_rows(f, pipeline)),
                timeout=TIMEOUT, what="the restarted sink's lag back at 0 and the session ended",
            )
    assert seen_rates and max(seen_rates) > 0  # events arrived between two reads: a throughput was shown
