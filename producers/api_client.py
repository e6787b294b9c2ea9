"""Resume through turnlog's HTTP API: agents need the broker and the API, no
database credentials.

``POST {api_url}/api/sessions/{id}/resume?timeout=<seconds>`` runs the resume
barrier next to the store (``producers/resume.py``) and answers with the
:class:`~turnlog.producers.grant.ResumeGrant` as JSON. HTTP answers and
transport errors become the recorder's own exceptions here, at this one
boundary (``raise ... from e``):

====================================  ======================================
answer                                exception
====================================  ======================================
200 with a grant                      (none: the grant is returned)
401, or no token given                :class:`ResumeUnauthorizedError`
404 (missing, or another fleet's)     :class:`SessionNotFoundError`
409 (ended, finalized, abandoned)     :class:`SessionClosedError`
502, 503, 504; timeout; no connection :class:`ResumeBarrierTimeout` (retry later)
any other status, or a garbled body   :class:`ResumeApiError`
====================================  ======================================

Each call is one request on a fresh connection: a resume is rare, and no
client is held open between resumes. A request can claim an epoch even when
its answer is lost (a timeout, a dropped connection); calling again is safe,
because the newer epoch fences the one never used. The token is sent only in
the ``Authorization`` header and never logged or put in a message.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

import httpx
import msgspec
from pydantic import SecretStr

from turnlog.producers.exceptions import (
    ResumeApiError,
    ResumeBarrierTimeout,
    ResumeUnauthorizedError,
    SessionClosedError,
    SessionNotFoundError,
)
from turnlog.producers.grant import MAX_RESUME_TIMEOUT_SECONDS, ResumeGrant, decode_grant
from turnlog.redact import redact, redact_url

__all__ = ["resume_via_api", "resume_via_api_async", "RESPONSE_MARGIN_SECONDS", "CONNECT_TIMEOUT_SECONDS"]

logger = logging.getLogger(__name__)

#: How much longer than the barrier's ``timeout`` the client waits for the
#: answer (seconds): the claim's transaction and the transfer of the turns.
RESPONSE_MARGIN_SECONDS = 15.0
#: Longest wait for a connection to the API (seconds).
CONNECT_TIMEOUT_SECONDS = 10.0


def resume_via_api(
    api_url: str,
    token: SecretStr | str | None,
    session_id: str,
    timeout: float,
    *,
    transport: httpx.BaseTransport | None = None,
) -> ResumeGrant:
    """Resume ``session_id`` through turnlog's API at ``api_url`` (e.g.
    ``http://127.0.0.1:8000``, ``settings.api_url``) with the bearer ``token``
    (``settings.api_token``). Blocking; see :func:`resume_via_api_async`.

    ``timeout``: longest wait at the resume barrier (seconds, 0 <
    ``timeout`` <= ``MAX_RESUME_TIMEOUT_SECONDS``); the call itself gives up
    ``RESPONSE_MARGIN_SECONDS`` later. ``transport`` replaces httpx's (tests).

    Returns the grant of an active session: its new epoch, stored position and
    stored turns in ``turn_index`` order.

    Raises:
        ResumeUnauthorizedError: no token, or the API does not know it.
        SessionNotFoundError: no such session within the token's fleets.
        SessionClosedError: the session has ended, was finalized or abandoned.
        ResumeBarrierTimeout: the pipeline did not catch up in time, or the API
            did not answer (unreachable, overloaded, timed out).
        ResumeApiError: any other answer, or a body that is not a grant.
        ValueError: ``timeout`` is out of range, or ``session_id`` is empty.
    """
    url, headers, params, limits = _request(api_url, token, session_id, timeout)
    try:
        with httpx.Client(timeout=limits, transport=transport) as client:
            response = client.post(url, headers=headers, params=params)
    except httpx.HTTPError as e:
        raise _transport_error(api_url, session_id, e) from e
    return _grant_from(response, session_id)


async def resume_via_api_async(
    api_url: str,
    token: SecretStr | str | None,
    session_id: str,
    timeout: float,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ResumeGrant:
    """:func:`resume_via_api` for an event loop: the same request, answers and exceptions."""
    url, headers, params, limits = _request(api_url, token, session_id, timeout)
    try:
        async with httpx.AsyncClient(timeout=limits, transport=transport) as client:
            response = await client.post(url, headers=headers, params=params)
    except httpx.HTTPError as e:
        raise _transport_error(api_url, session_id, e) from e
    return _grant_from(response, session_id)


def _request(
    api_url: str, token: SecretStr | str | None, session_id: str, timeout: float
) -> tuple[str, dict[str, str], dict[str, str], httpx.Timeout]:
    if not session_id:
        raise ValueError("session_id is empty")
    if not 0 < timeout <= MAX_RESUME_TIMEOUT_SECONDS:
        raise ValueError(f"timeout must be in (0, {MAX_RESUME_TIMEOUT_SECONDS:g}] seconds, not {timeout!r}")
    secret = token.get_secret_value() if isinstance(token, SecretStr) else token
    if not secret or not secret.strip():
        raise ResumeUnauthorizedError("no API token: set TURNLOG_API_TOKEN to resume through turnlog's API")
    url = f"{api_url.rstrip('/')}/api/sessions/{quote(session_id, safe='')}/resume"
    headers = {"Authorization": f"Bearer {secret.strip()}", "Accept": "application/json"}
    limits = httpx.Timeout(timeout + RESPONSE_MARGIN_SECONDS, connect=min(CONNECT_TIMEOUT_SECONDS, timeout + 1))
    return url, headers, {"timeout": repr(float(timeout))}, limits


def _transport_error(api_url: str, session_id: str, error: httpx.HTTPError) -> Exception:
    where, why = redact_url(api_url), redact(str(error))  # a user:password@ in the URL stays out
    if isinstance(error, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return ResumeApiError(f"resume of {session_id}: {where!r} is not a usable API URL: {why}")
    if isinstance(error, httpx.TimeoutException):
        return ResumeBarrierTimeout(f"resume of {session_id}: turnlog's API at {where} did not answer in time")
    return ResumeBarrierTimeout(
        f"resume of {session_id}: turnlog's API at {where} cannot be reached ({type(error).__name__}: {why})"
    )


def _detail(response: httpx.Response) -> str:
    """The API's ``detail`` message, or the start of the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    detail = body.get("detail") if isinstance(body, dict) else None
    return str(detail) if detail is not None else response.text[:200]


def _grant_from(response: httpx.Response, session_id: str) -> ResumeGrant:
    status = response.status_code
    if status == 200:
        try:
            grant = decode_grant(response.content)
        except msgspec.DecodeError as e:
            raise ResumeApiError(f"resume of {session_id}: the API's answer is not a resume grant: {e}", status) from e
        if grant.session_id != session_id:
            raise ResumeApiError(f"resume of {session_id}: the API granted {grant.session_id!r} instead", status)
        logger.info("resume of %s granted by the API: epoch %d, %d stored turns", session_id, grant.epoch,
                    len(grant.turns))
        return grant
    detail = _detail(response)
    if status == 401:
        raise ResumeUnauthorizedError(f"resume of {session_id}: the API refused the token (401): {detail}", status)
    if status == 404:
        raise SessionNotFoundError(f"no session {session_id} (or not within the token's fleets): {detail}")
    if status == 409:
        raise SessionClosedError(f"session {session_id} cannot be resumed: {detail}")
    if status in (502, 503, 504):
        retry_after = response.headers.get("Retry-After")
        hint = f"; retry after {retry_after}s" if retry_after else ""
        raise ResumeBarrierTimeout(f"resume of {session_id}: the API answered {status}: {detail}{hint}")
    raise ResumeApiError(f"resume of {session_id}: the API answered {status}: {detail}", status)
