"""resume_via_api against canned HTTP answers (httpx.MockTransport): every
answer becomes the right exception, and the request carries what the API needs."""

import asyncio

import httpx
import pytest
from pydantic import SecretStr

from turnlog.producers import (
    ResumeApiError,
    ResumeBarrierTimeout,
    ResumeUnauthorizedError,
    SessionClosedError,
    SessionNotFoundError,
)
from turnlog.producers.api_client import resume_via_api, resume_via_api_async
from turnlog.producers.grant import ResumeGrant, encode_grant

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
