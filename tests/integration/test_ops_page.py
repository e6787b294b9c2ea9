"""The operations page (/ops) in headless Chromium (Debian's package, driven by Playwright)
over the real pipeline and a real Prometheus (Debian's /usr/bin/prometheus) scraping the
sink process and this test's recorder.

The page is signed in as a person would (the token typed into its form); it must show
the lag of every transcript partition of the pipeline, turn-to-store p50/p99 from
Prometheus, and, once the sink is stopped while turns keep coming, the partition the
sink has fallen behind on. It saves a screenshot (``TURNLOG_OPS_SCREENSHOT``, default
the test's temporary folder; docs/images/ops.png is one). Another test, over a SQLite
store alone, checks that a token scoped to some fleets is refused (403) and that the
page says which sources are not configured."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Page, async_playwright
from prometheus_client import start_http_server

from turnlog.api.app import create_app
from turnlog.api.ops import OpsBoard
from turnlog.producers import SessionRecorder
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store
from turnlog.sinks.migrate import upgrade_to_head

from tests.api_server import serve
from tests.support import free_port, wait_until

pytestmark = pytest.mark.integration

TIMEOUT = 90
TIMEOUT_MS = TIMEOUT * 1000
TOKEN = "ops-page-token"
CHROMIUM = os.environ.get("TURNLOG_CHROMIUM", "/usr/bin/chromium")
PROMETHEUS = os.environ.get("TURNLOG_PROMETHEUS", "/usr/bin/prometheus")


@pytest.fixture
def agent_metrics_port() -> Iterator[int]:
    """This process's metrics (the recorder's spool and degraded gauges) on a port of its own."""
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1")
    yield port
    server.shutdown()
    thread.join(10)


def prometheus_config(targets: dict[str, int]) -> str:
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        for job, port in targets.items()
    )
    return ("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n{jobs}")


def targets_up(base: str, jobs: set[str]) -> bool:
    try:
        answer = httpx.get(f"{base}/api/v1/targets", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return False
    return {t["labels"]["job"] for t in answer["data"]["activeTargets"] if t["health"] == "up"} >= jobs


@pytest.fixture
def prometheus(tmp_path: Path):
    """``start(targets) -> base URL``: a Prometheus scraping ``{job: port}`` every second,
    stopped at the end."""
    if shutil.which(PROMETHEUS) is None:
        pytest.fail(f"{PROMETHEUS} not found: run `bash deploy/prometheus.sh install` (Debian's prometheus)")
    started: list[subprocess.Popen[bytes]] = []

    def start(targets: dict[str, int]) -> str:
        folder = tmp_path / "prometheus"
        folder.mkdir()
        (folder / "prometheus.yml").write_text(prometheus_config(targets))
        port = free_port()
        with (folder / "prometheus.log").open("wb") as log:
            started.append(subprocess.Popen(
                [PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=log, stderr=subprocess.STDOUT,
            ))
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: targets_up(base, set(targets)), timeout=TIMEOUT,
                   what=f"Prometheus to scrape {sorted(targets)} (log: {folder / 'prometheus.log'})")
        return base

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} not found: run `bash deploy/browser.sh` (installs Debian's chromium)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"],
        )
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        page = await context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        yield page
        await browser.close()


async def lag_rows(page: Page) -> list[dict[str, str]]:
    return await page.eval_on_selector_all(
        "#lag tbody tr[data-group]", "rows => rows.map(r => ({...r.dataset}))"
    )


async def test_ops_page_shows_lag_per_partition_and_turn_to_store_from_prometheus(
    new_pipeline, prometheus, agent_metrics_port, page, tmp_path
):
    pipeline = new_pipeline(("sequencer",))
    sink_metrics = free_port()
    pipeline.start("sink", env={"TURNLOG_METRICS_PORT": str(sink_metrics)})
    pipeline.wait_ready()
    prometheus_url = prometheus({"turnlog-sink": sink_metrics, "turnlog-agent": agent_metrics_port})
    settings = pipeline.settings.model_copy(
        update={"api_tokens": {TOKEN: ["*"]}, "ops_prometheus_url": prometheus_url, "ops_refresh_seconds": 1.0}
    )
    transcript, sink_group = pipeline.settings.topics.transcript, pipeline.settings.sink_group
    with serve(create_app(settings, pipeline.store, live=False)) as base:
        async with SessionRecorder(pipeline.settings) as recorder:
            # Sessions over several partitions, their turns stored while Prometheus scrapes the sink.
            sessions = []
            for n in range(6):
                session = await recorder.start_session(f"ops-{n}-{uuid.uuid4().hex[:6]}", fleet="fleet-ops",
                                                       agent_id=f"agent-{n}")
                sessions.append(session)
                for index in range(4):
                    await session.complete_turn(index, "user" if index % 2 == 0 else "agent", f"turn {index}")

            await page.goto(f"{base}/ops")
            await page.fill("#token", TOKEN)
            await page.press("#token", "Enter")
            assert await page.evaluate("() => sessionStorage.getItem('turnlog-token')") == TOKEN
            assert TOKEN not in page.url

            # Every transcript partition of the pipeline in the lag table, the sink caught up on each.
            partitions = {str(p) for p in range(pipeline.settings.partitions)}
            await page.wait_for_function(
                """([group, topic, count]) => {
                    const rows = [...document.querySelectorAll('#lag tbody tr[data-group]')]
                      .filter(r => r.dataset.group === group && r.dataset.topic === topic);
                    return rows.length === count && rows.every(r => r.dataset.records === '0');
                }""",
                arg=[sink_group, transcript, len(partitions)],
            )
            shown = [row for row in await lag_rows(page) if row["group"] == sink_group and row["topic"] == transcript]
            assert {row["partition"] for row in shown} == partitions

            # Turn-to-store p50 and p99 from Prometheus' histogram of the sink.
            await page.wait_for_function(
                "() => document.querySelector('#tile-p50').dataset.value && document.querySelector('#tile-p99').dataset.value"
            )
            p50 = float(await page.get_attribute("#tile-p50", "data-value"))
            p99 = float(await page.get_attribute("#tile-p99", "data-value"))
            assert 0 < p50 <= p99
            assert await page.text_content("#sessions-open") == str(len(sessions))
            assert await page.text_content("#degraded-count") == "0"
            assert await page.get_attribute("#state", "data-state") == "live"

            # The sink stops; turns keep coming: the page shows where it fell behind.
            pipeline.stop("sink")
            for session in sessions[:3]:
                for index in range(4, 8):
                    await session.complete_turn(index, "user" if index % 2 == 0 else "agent", f"turn {index}")
            await page.wait_for_function(
                """([group, topic]) => [...document.querySelectorAll('#lag tbody tr[data-group]')]
                    .some(r => r.dataset.group === group && r.dataset.topic === topic && Number(r.dataset.records) > 0)""",
                arg=[sink_group, transcript],
            )
            behind = [row for row in await lag_rows(page)
                      if row["group"] == sink_group and row["topic"] == transcript and row["behind"] == "true"]
            assert behind and sum(int(row["records"]) for row in behind) >= 12  # 3 sessions x 4 turns at least
            screenshot = Path(os.environ.get("TURNLOG_OPS_SCREENSHOT", tmp_path / "ops.png"))
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(screenshot), full_page=True)
            assert screenshot.stat().st_size > 0
            for session in sessions:
                await session.end("completed")


async def test_ops_page_refuses_a_fleet_token_and_says_what_is_not_configured(page, tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    upgrade_to_head(store.engine)
    settings = TurnlogSettings(api_tokens={TOKEN: ["*"], "fleet-token": ["fleet-a"]})
    board = OpsBoard(lag=None, store=store, prometheus=None, refresh_seconds=1.0)
    try:
        with serve(create_app(settings, store, live=False, ops=board)) as base:
            await page.goto(f"{base}/ops")
            await page.fill("#token", "fleet-token")
            await page.press("#token", "Enter")
            await page.wait_for_function("() => window.turnlogOps.error === 'HTTP 403'")
            assert await page.get_attribute("#state", "data-state") == "error"
            assert await page.evaluate("() => window.turnlogOps.polls") == 0  # nothing shown to that token

            await page.fill("#token", TOKEN)
            await page.press("#token", "Enter")
            await page.wait_for_function("() => window.turnlogOps.polls >= 2")  # it keeps polling
            assert await page.get_attribute("#state", "data-state") == "live"
            assert await page.text_content("#sessions-open") == "0"
            assert await page.get_attribute("#prometheus-state", "data-state") == "not_configured"
            assert await page.get_attribute("#lag-state", "data-state") == "not_configured"
            assert await page.text_content("#tts-p50") == "–"
    finally:
        store.engine.dispose()
