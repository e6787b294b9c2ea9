"""The live transcript page in headless Chromium (Debian's package, driven by Playwright).

The API runs as a real process; the forced disconnect is a SIGKILL of it and a
restart on the same port, so the page must reconnect by itself with
Last-Event-ID and still show every turn exactly once, in order. The token is
typed into the page's form, as a person would, and must never reach the URL.
One test serves the page next to a stand-in event stream whose network chunks
end between the ``\r`` and the ``\n`` of a line end.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import shutil
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlencode

import httpx
import pytest
from playwright.async_api import Page, async_playwright
from sqlalchemy import select

from turnlog.api.app import create_app
from turnlog.producers import SessionRecorder
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store
from turnlog.sinks.tables import session_events, transcript_turns

from tests.api_server import serve
from tests.support import free_port, wait_until

TIMEOUT_MS = 60_000
CHROMIUM = os.environ.get("TURNLOG_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture
def page_pipeline(new_pipeline):
    running = new_pipeline(
        ("sequencer", "sink", "api"),
        api_tokens={"page-token": ["fleet-page"]},
        api_port=free_port(),
        api_poll_seconds=0.5,
    )
    running.wait_ready()
    return running


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
        context = await browser.new_context()
        page = await context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        yield page
        await browser.close()


def stored_turns(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                select(transcript_turns.c.turn_index, transcript_turns.c.text, transcript_turns.c.status)
                .where(transcript_turns.c.session_id == session_id)
                .order_by(transcript_turns.c.turn_index)
            )
        ]


def stored_last_seq(pipeline, session_id):
    with pipeline.store.engine.connect() as conn:
        return conn.execute(select(session_events.c.seq).where(session_events.c.session_id == session_id).order_by(session_events.c.seq.desc())).scalar()


async def until(probe, what: str, timeout: float = 60):
    return await asyncio.to_thread(wait_until, probe, timeout=timeout, what=what)


def live_url(pipeline, session_id: str) -> str:
    """The live page of ``session_id`` (a session key), its fragment written as the page writes it
    (``URLSearchParams``: the key's ``:`` is ``%3A``)."""
    return f"http://127.0.0.1:{pipeline.settings.api_port}/live#{urlencode({'session': session_id})}"


async def sign_in(page: Page, url: str, token: str) -> None:
    """Open the page at ``url`` (``/live#session=<id>``) and type the token into its form."""
    await page.goto(url)
    await page.fill("#token", token)
    await page.press("#token", "Enter")
    # The token is kept in the tab's sessionStorage, never in the address or its history.
    assert await page.evaluate("() => sessionStorage.getItem('turnlog-token')") == token
    assert token not in page.url and token not in await page.evaluate("() => location.href")


async def page_turns(page: Page) -> list[tuple[int, str, str]]:
    rows = await page.eval_on_selector_all(
        "#turns .turn",
        "nodes => nodes.map(n => [Number(n.dataset.turnIndex), n.querySelector('.text').textContent, n.dataset.status])",
    )
    return [tuple(row) for row in rows]


async def test_live_page_shows_turns_partials_and_survives_a_forced_disconnect(page_pipeline, page):
    pipeline = page_pipeline
    async with SessionRecorder(pipeline.settings) as recorder:
        session = await recorder.start_session(f"page-{uuid.uuid4().hex[:6]}", fleet="fleet-page", agent_id="agent-1")
        session_id, url = session.session_id, live_url(pipeline, session.session_id)
        await session.complete_turn(0, "user", "Hello, is this the help line?")
        await until(lambda: stored_turns(pipeline, session_id), "turn 0 committed to the store")

        # A turn committed to the store appears on the page.
        await sign_in(page, url, "page-token")
        await page.wait_for_function("() => document.querySelector('#turn-0 .text')?.textContent === 'Hello, is this the help line?'")
        assert await page.get_attribute("#state", "data-state") == "live"

        # A partial appears, then grows in place.
        session.update_partial(1, "agent", "Yes it")
        await session.flush_partial()
        await page.wait_for_function("() => document.querySelector('#turn-1')?.dataset.status === 'partial'")
        session.update_partial(1, "agent", "Yes it is, how can")
        await session.flush_partial()
        await page.wait_for_function("() => document.querySelector('#turn-1 .text')?.textContent === 'Yes it is, how can'")
        assert await page.locator("#turn-1").count() == 1

        # Forced disconnect: the API process dies; turns keep coming meanwhile.
        pipeline.processes["api"].kill()
        await page.wait_for_function("() => document.querySelector('#state').dataset.state === 'reconnecting'")
        await session.complete_turn(1, "agent", "Yes it is, how can I help?")
        await session.complete_turn(2, "user", "My order never arrived.")
        pipeline.stop("api")
        pipeline.start("api")
        await page.wait_for_function("() => window.turnlog.connections >= 2 && document.querySelector('#state').dataset.state === 'live'")
        await session.complete_turn(3, "agent", "Sorry to hear that, let me check.")
        await session.end("completed")
    await page.wait_for_function("() => window.turnlog.ended === true")

    seen = await page.evaluate("() => window.turnlog.seen")
    end_seq = await until(lambda: stored_last_seq(pipeline, session_id) == seen[-1] and seen[-1], "session.ended stored")
    assert seen == list(range(end_seq + 1))  # every event exactly once, in order, across the reconnect
    expected = [(index, text, "complete") for index, text, _ in stored_turns(pipeline, session_id)]
    assert await page_turns(page) == expected
    assert [index for index, _, _ in expected] == [0, 1, 2, 3]
    assert await page.get_attribute("#state", "data-state") == "ended"
    assert page.url == url  # the address names the session, and nothing else


async def test_live_page_wipes_a_session_forgotten_while_shown_and_does_not_reconnect(page_pipeline, page):
    pipeline = page_pipeline
    base = f"http://127.0.0.1:{pipeline.settings.api_port}"
    async with SessionRecorder(pipeline.settings) as recorder:
        session = await recorder.start_session(f"gone-{uuid.uuid4().hex[:6]}", fleet="fleet-page", agent_id="agent-1")
        session_id = session.session_id
        await session.complete_turn(0, "user", "My address is 12 Wolverhampton Road")
        await until(lambda: stored_turns(pipeline, session_id), "turn 0 committed to the store")
        await sign_in(page, live_url(pipeline, session_id), "page-token")
        await page.wait_for_function("() => document.querySelector('#turn-0 .text')?.textContent.includes('Wolverhampton')")
        async with httpx.AsyncClient(base_url=base, headers={"Authorization": "Bearer page-token"}) as client:
            answer = await client.delete(f"/api/sessions/{session_id}", params={"wait": 30}, timeout=60)
        assert answer.status_code == 200, answer.text
        await page.wait_for_function("() => document.querySelector('#state').dataset.state === 'erased'")
    assert await page.locator("#turns .turn").count() == 0 and await page.text_content("#meta") == ""
    assert await page.evaluate("() => window.turnlog.connections") == 1  # ended, not reconnecting
    await page.reload()  # opened again: 410, shown as forgotten at once
    await page.wait_for_function("() => document.querySelector('#state').dataset.state === 'erased'")
    assert await page.locator("#turns .turn").count() == 0


async def test_live_page_reports_a_refused_token(page_pipeline, page):
    url = f"http://127.0.0.1:{page_pipeline.settings.api_port}/live#session=anything"
    async with httpx.AsyncClient() as client:  # the page itself needs no token: it holds no data
        assert (await client.get(url.split("#")[0])).status_code == 200
    await sign_in(page, url, "wrong")
    await page.wait_for_function("() => document.querySelector('#state').dataset.state === 'error'")
    assert "401" in await page.text_content("#state")


async def test_an_old_link_with_the_token_in_its_fragment_loses_it_unused(page_pipeline, page):
    base = f"http://127.0.0.1:{page_pipeline.settings.api_port}/live"
    await page.goto(f"{base}#token=page-token&session=anything")
    await page.wait_for_function("() => !location.hash.includes('token')")
    assert page.url == f"{base}#session=anything"
    assert await page.evaluate("() => sessionStorage.getItem('turnlog-token')") is None
    assert await page.get_attribute("#state", "data-state") == "idle"  # nothing was asked with it


async def test_live_page_marks_a_barged_in_turn_cut_off_apart_from_an_interrupted_one(page_pipeline, page):
    pipeline = page_pipeline
    async with SessionRecorder(pipeline.settings) as recorder:
        session = await recorder.start_session(f"barge-{uuid.uuid4().hex[:6]}", fleet="fleet-page", agent_id="agent-1")
        session_id, url = session.session_id, live_url(pipeline, session.session_id)
        session.update_partial(0, "agent", "Your order ships on")
        await session.flush_partial()
        await session.complete_turn(0, "agent", "Your order ships on Mon", barged_in=True)  # the user cut in
        await until(lambda: stored_turns(pipeline, session_id), "turn 0 committed to the store")
        await sign_in(page, url, "page-token")  # the page follows a session the store knows
        await page.wait_for_function("() => document.querySelector('#turn-0')?.dataset.bargedIn === 'true'")
        await session.complete_turn(1, "user", "Wait, which order?")
        session.update_partial(2, "agent", "The one from")
        await session.flush_partial()
        await session.end("hangup")  # turn 2 was never completed: interrupted
    await page.wait_for_function("() => window.turnlog.ended === true")

    shown = await page.eval_on_selector_all(
        "#turns .turn",
        """nodes => nodes.map(n => [Number(n.dataset.turnIndex), n.dataset.status, n.dataset.bargedIn,
                                    n.querySelector('.cut').hidden ? '' : n.querySelector('.cut').innerText,
                                    n.querySelector('.text').textContent])""",
    )
    assert [tuple(row) for row in shown] == [
        (0, "complete", "true", "CUT OFF", "Your order ships on Mon"),
        (1, "complete", "false", "", "Wait, which order?"),
        (2, "interrupted", "false", "", "The one from"),
    ]
    assert await page.locator("#turn-0 .cut").is_visible() and not await page.locator("#turn-2 .cut").is_visible()
    stored = await until(lambda: len(stored_turns(pipeline, session_id)) == 3 and stored_turns(pipeline, session_id), "3 turns stored")
    assert [status for _, _, status in stored] == ["complete", "complete", "interrupted"]


# -- the page's SSE parser, against chunks split inside a line end -------------------------------
SPLIT_EVENTS = [
    (0, "session.started", {"type": "session.started", "fleet": "f", "agent_id": "a", "started_at": "t0"}),
    (1, "turn.partial", {"type": "turn.partial", "turn_index": 0, "speaker": "user", "text": "Hel"}),
    (2, "turn.completed", {"type": "turn.completed", "turn_index": 0, "speaker": "user", "text": "Hello there"}),
    (3, "turn.completed", {"type": "turn.completed", "turn_index": 1, "speaker": "agent", "text": "Hi, how can I help?"}),
    (4, "session.ended", {"type": "session.ended", "reason": "hangup", "ended_at": "t1"}),
]


def split_chunks() -> list[bytes]:
    """The events as text/event-stream with CRLF line ends, cut after every ``\r`` of a ``\r\n``:
    each chunk but the last ends between the two bytes of a line end (the blank line that ends an
    event included)."""
    stream = "".join(
        f"id: {seq}\r\nevent: {kind}\r\ndata: {json.dumps(data)}\r\n\r\n" for seq, kind, data in SPLIT_EVENTS
    )
    return [chunk.encode() for chunk in re.split(r"(?<=\r)(?=\n)", stream)]


def split_stream_app(real_app, chunks: list[bytes], go: queue.Queue):
    """The API's own app for the page and its files, with a stand-in session list and an event
    stream that sends ``chunks`` one at a time, each only once ``go`` says the page read the one before."""

    async def app(scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and path == "/api/sessions":
            body = json.dumps({"sessions": [{"id": "split", "status": "active"}], "next_cursor": None}).encode()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
        elif scope["type"] == "http" and path == "/api/sessions/split/events":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store")]})
            for number, chunk in enumerate(chunks):
                if number:  # the page has read chunk number - 1 alone: it ends inside a line end
                    await asyncio.to_thread(go.get, True, 60)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await real_app(scope, receive, send)

    return app


async def test_live_page_keeps_every_event_when_a_chunk_ends_between_cr_and_lf(page, tmp_path):
    chunks = split_chunks()
    assert len(chunks) == 4 * len(SPLIT_EVENTS) + 1 and all(c.endswith(b"\r") for c in chunks[:-1])
    settings = TurnlogSettings(database_url=f"sqlite:///{tmp_path / 'unused.db'}", api_tokens={"page-token": ["f"]})
    store = open_store(settings.database_url.get_secret_value())
    go: queue.Queue = queue.Queue()
    app = split_stream_app(create_app(settings, store, live=False), chunks, go)
    with serve(app) as base:
        await sign_in(page, f"{base}/live#session=split", "page-token")
        for number in range(1, len(chunks)):
            await page.wait_for_function(f"() => window.turnlog.chunks >= {number}")
            go.put(number)
        await page.wait_for_function("() => window.turnlog.ended === true")
        assert await page.evaluate("() => window.turnlog.seen") == [seq for seq, _, _ in SPLIT_EVENTS]
        assert await page_turns(page) == [(0, "Hello there", "complete"), (1, "Hi, how can I help?", "complete")]
        assert await page.get_attribute("#state", "data-state") == "ended"
    store.engine.dispose()
