"""resume_via_api against canned HTTP answers (httpx.MockTransport): every
answer becomes the right exception, and the request carries what the API needs."""

import asyncio
import datetime as dt

import httpx
import msgspec
import pytest
from pydantic import SecretStr

from turnlog.producers import (
    ResumeApiError,
    ResumeBarrierTimeout,
    ResumeUnauthorizedError,
    SessionClosedError,
    SessionErasedError,
    SessionNotFoundError,
)
from turnlog.producers.api_client import resume_via_api, resume_via_api_async
from turnlog.producers.grant import ResumeGrant, StoredTurn, encode_grant

API = "http://turnlog.test:8000/"
GRANT = ResumeGrant("call/42", epoch=2, status="active", last_seq=5, max_turn_index=1)


def answering(status: int, body: bytes = b"", headers: dict[str, str] | None = None, seen: list | None = None):
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, content=body, headers=headers)

    return httpx.MockTransport(handler)


def test_a_grant_comes_back_and_the_request_carries_token_timeout_and_quoted_id():
    seen: list[httpx.Request] = []
    grant = resume_via_api(API, SecretStr("tok-1"), "call/42", 7.5, transport=answering(200, encode_grant(GRANT), seen=seen))
    assert grant == GRANT
    [request] = seen
    assert request.method == "POST"
    assert request.url.raw_path == b"/api/sessions/call%2F42/resume?timeout=7.5"
    assert request.headers["authorization"] == "Bearer tok-1"


def test_the_async_client_gives_the_same_grant():
    async def run():
        def handler(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, content=encode_grant(GRANT))

        return await resume_via_api_async(API, "tok-1", "call/42", 3, transport=httpx.MockTransport(handler))

    assert asyncio.run(run()) == GRANT


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (401, ResumeUnauthorizedError),
        (404, SessionNotFoundError),
        (409, SessionClosedError),
        (502, ResumeBarrierTimeout),
        (503, ResumeBarrierTimeout),
        (504, ResumeBarrierTimeout),
        (500, ResumeApiError),
        (422, ResumeApiError),
    ],
)
def test_each_http_answer_becomes_the_recorders_exception(status, error):
    body = b'{"detail": "the API says why"}'
    with pytest.raises(error, match="the API says why") as caught:
        resume_via_api(API, "tok-1", "call/42", 3, transport=answering(status, body, {"Retry-After": "2"}))
    assert "tok-1" not in str(caught.value)
    if status == 503:
        assert "retry after 2s" in str(caught.value)


def test_a_forgotten_session_is_the_recorders_erasure_error():
    body = b'{"session_id": "call/42", "status": "pending", "requested_at": "2026-12-07T00:00:00Z"}'
    with pytest.raises(SessionErasedError) as caught:
        resume_via_api(API, "tok-1", "call/42", 3, transport=answering(410, body))
    assert caught.value.session_id == "call/42"


def test_a_garbled_or_foreign_grant_is_refused():
    with pytest.raises(ResumeApiError, match="not a resume grant"):
        resume_via_api(API, "tok-1", "call/42", 3, transport=answering(200, b"<html>proxy login</html>"))
    other = ResumeGrant("another", epoch=1, status="active", last_seq=0, max_turn_index=None)
    with pytest.raises(ResumeApiError, match="another"):
        resume_via_api(API, "tok-1", "call/42", 3, transport=answering(200, encode_grant(other)))


@pytest.mark.parametrize("failure", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow")])
def test_an_unreachable_or_silent_api_is_a_barrier_timeout(failure):
    def handler(request: httpx.Request) -> httpx.Response:
        raise failure

    with pytest.raises(ResumeBarrierTimeout) as caught:
        resume_via_api(API, "tok-1", "call/42", 3, transport=httpx.MockTransport(handler))
    assert caught.value.__cause__ is failure


def test_a_real_refused_connection_is_a_barrier_timeout():
    from tests.support import free_port

    with pytest.raises(ResumeBarrierTimeout, match="cannot be reached"):
        resume_via_api(f"http://127.0.0.1:{free_port()}", "tok-1", "s", 1)


@pytest.mark.parametrize("token", [None, "", "  ", SecretStr("")])
def test_no_token_is_refused_before_any_request(token):
    seen: list[httpx.Request] = []
    with pytest.raises(ResumeUnauthorizedError, match="TURNLOG_API_TOKEN"):
        resume_via_api(API, token, "s", 3, transport=answering(200, encode_grant(GRANT), seen=seen))
    assert seen == []


@pytest.mark.parametrize(("session_id", "timeout"), [("", 3), ("s", 0), ("s", -1), ("s", 601), ("s", float("nan"))])
def test_bad_arguments_are_refused_before_any_request(session_id, timeout):
    seen: list[httpx.Request] = []
    with pytest.raises(ValueError):
        resume_via_api(API, "tok-1", session_id, timeout, transport=answering(200, encode_grant(GRANT), seen=seen))
    assert seen == []


# -- 429: the token's resume limit on the API ------------------------------------------------------
def test_a_429_is_asked_again_after_its_retry_after_while_the_timeout_allows():
    seen: list[httpx.Request] = []
    answers = [httpx.Response(429, json={"detail": "busy"}, headers={"Retry-After": "0.1"}),
               httpx.Response(200, content=encode_grant(GRANT))]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    assert resume_via_api(API, "tok-1", "call/42", 5, transport=httpx.MockTransport(handler)) == GRANT
    assert len(seen) == 2
    first, again = (float(r.url.params["timeout"]) for r in seen)
    assert first == 5 and 0 < again < 5  # the second asks only for what is left of the timeout


def test_a_429_that_outlasts_the_timeout_is_a_barrier_timeout():
    busy = answering(429, b'{"detail": "busy"}', {"Retry-After": "5"})
    with pytest.raises(ResumeBarrierTimeout, match="429"):
        resume_via_api(API, "tok-1", "call/42", 2, transport=busy)

    async def run():
        await resume_via_api_async(API, "tok-1", "call/42", 2, transport=httpx.MockTransport(
            lambda request: httpx.Response(429, json={"detail": "busy"}, headers={"Retry-After": "5"})))

    with pytest.raises(ResumeBarrierTimeout, match="429"):
        asyncio.run(run())


# -- paging: a grant whose turns continue in the transcript ----------------------------------------
def turn(index: int) -> StoredTurn:
    started = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=index)
    return StoredTurn(index, "user", f"turn {index}", "complete", started, started, 1, 2, None)


def transcript_page(turns: list[StoredTurn], next_after_turn: int | None) -> bytes:
    """A transcript page as the API answers it (FastAPI's JSON of the rows, and the session)."""
    rows = [{**msgspec.to_builtins(t), "epoch": 0, "seq": t.turn_index + 1} for t in turns]
    return msgspec.json.encode({"session": {"id": "call/42"}, "turns": rows, "next_after_turn": next_after_turn})


def paged_api(pages: dict[str, bytes], seen: list[httpx.Request], first: ResumeGrant):
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "POST":
            return httpx.Response(200, content=encode_grant(first))
        return httpx.Response(200, content=pages[request.url.params["after_turn"]])

    return httpx.MockTransport(handler)


def test_the_client_follows_the_transcript_pages_up_to_the_grants_last_turn():
    turns = [turn(i) for i in range(7)]
    first = ResumeGrant("call/42", epoch=3, status="active", last_seq=9, max_turn_index=5, turns=tuple(turns[:2]),
                        next_after_turn=1)
    # Page two ends at turn 3; page three holds a turn the grant does not count (written after the claim).
    pages = {"1": transcript_page(turns[2:4], 3), "3": transcript_page(turns[4:7], None)}
    seen: list[httpx.Request] = []
    grant = resume_via_api(API, "tok-1", "call/42", 5, transport=paged_api(pages, seen, first))
    assert grant.turns == tuple(turns[:6]) and grant.next_after_turn is None
    assert (grant.epoch, grant.max_turn_index, grant.next_turn_index) == (3, 5, 6)
    reads = [r for r in seen if r.method == "GET"]
    assert [r.url.raw_path for r in reads] == [
        b"/api/sessions/call%2F42/transcript?after_turn=1&limit=1000",
        b"/api/sessions/call%2F42/transcript?after_turn=3&limit=1000",
    ]
    assert all(r.headers["authorization"] == "Bearer tok-1" for r in reads)


def test_a_transcript_page_that_does_not_continue_the_turns_is_refused():
    first = ResumeGrant("call/42", epoch=1, status="active", last_seq=9, max_turn_index=5, turns=(turn(0), turn(1)),
                        next_after_turn=1)
    for page in (transcript_page([], None), transcript_page([turn(0), turn(1)], 1), b"<html>proxy</html>"):
        with pytest.raises(ResumeApiError, match="transcript page"):
            resume_via_api(API, "tok-1", "call/42", 5, transport=paged_api({"1": page}, [], first))


def test_a_refused_transcript_page_is_the_same_error_as_a_refused_resume():
    first = ResumeGrant("call/42", epoch=1, status="active", last_seq=9, max_turn_index=5, turns=(turn(0),),
                        next_after_turn=0)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(200, content=encode_grant(first))
        return httpx.Response(503, json={"detail": "the store is unavailable; try again"})

    with pytest.raises(ResumeBarrierTimeout, match="503"):
        resume_via_api(API, "tok-1", "call/42", 5, transport=httpx.MockTransport(handler))
