"""`turnlog api` serves its metrics on TURNLOG_METRICS_PORT, and counts the live streams (SSE)
it holds open: one while a client follows a session, none once the client went away."""

from __future__ import annotations

import urllib.request
import uuid

import httpx
from prometheus_client.parser import text_string_to_metric_families

from turnlog import kafka

from tests.support import EventFactory, free_port, signed_event, sse_events, wait_until

TIMEOUT = 90
TOKEN = "tok-metrics"


def live_streams(port: int) -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "turnlog_api_live_streams":
                return sample.value
    return None


async def test_the_api_counts_the_live_streams_it_holds_open(new_pipeline):
    pipeline = new_pipeline(("sequencer", "sink"), api_tokens={TOKEN: ["*"]}, api_port=free_port())
    metrics_port = free_port()
    pipeline.start("api", env={"TURNLOG_METRICS_PORT": str(metrics_port)})
    pipeline.wait_ready()
    settings = pipeline.settings
    f = EventFactory(f"live-{uuid.uuid4().hex[:8]}")
    producer = kafka.producer(settings, client_id="test-live", delivery_timeout_seconds=10)
    for event in (f.started(), f.completed(1, 0, "hello")):  # not ended: the stream stays open
        key, value, headers = signed_event(settings, event)
        producer.produce(settings.topics.events, key=key, value=value, headers=headers)
    assert producer.flush(10) == 0
    base = f"http://127.0.0.1:{settings.api_port}"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    wait_until(lambda: httpx.get(f"{base}/api/sessions/{f.session_id}", headers=headers).status_code == 200,
               timeout=TIMEOUT, what="the session visible in the API")
    wait_until(lambda: live_streams(metrics_port) is not None, timeout=TIMEOUT, what="the API's metrics")
    assert live_streams(metrics_port) == 0

    async with (
        httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(10, read=60)) as client,
        client.stream("GET", f"/api/sessions/{f.session_id}/events", headers=headers) as response,
    ):
        assert response.status_code == 200
        async for event in sse_events(response.aiter_lines()):
            assert event.event == "session.started"
            break
        assert live_streams(metrics_port) == 1
    wait_until(lambda: live_streams(metrics_port) == 0, timeout=TIMEOUT, what="the stream counted closed")
