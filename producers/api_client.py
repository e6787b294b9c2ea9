"""Resume through turnlog's HTTP API: agents need the broker and the API, no
database credentials.

``POST {api_url}/api/sessions/{id}/resume?timeout=<seconds>`` runs the resume
barrier next to the store (``turnlog/resume_barrier.py``) and answers with the
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
410 (forgotten, or being forgotten)   :class:`SessionErasedError`
429 past the call's timeout           :class:`ResumeBarrierTimeout` (retry later)
502, 503, 504; timeout; no connection :class:`ResumeBarrierTimeout` (retry later)
any other status, or a garbled body   :class:`ResumeApiError`
====================================  ======================================

A 429 (the token's resume limit on the API is reached) is retried after its
``Retry-After`` while the call's ``timeout`` allows. A grant whose turns did
not fit one answer names where they continue (``next_after_turn``); the
client then reads the rest from ``GET /api/sessions/{id}/transcript``, page
by page up to the grant's ``max_turn_index`` (``producers/grant.py``), and
returns one grant with every turn.

Each call uses one fresh client for its requests: a resume is rare, and no
client is held open between resumes. A request can claim an epoch even when
its answer is lost (a timeout, a dropped connection); calling again is safe,
because the newer epoch fences the one never used. The token is sent only in
the ``Authorization`` header and never logged or put in a message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from urllib.parse import quote

import httpx
import msgspec
from pydantic import SecretStr

from turnlog.producers.exceptions import (
    ResumeApiError,
    ResumeBarrierTimeout,
    ResumeUnauthorizedError,
    SessionClosedError,
    SessionErasedError,
    SessionNotFoundError,
)
from turnlog.producers.grant import (
    MAX_RESUME_TIMEOUT_SECONDS,
    RESUME_TURN_PAGE,
    ResumeGrant,
    StoredTurn,
    decode_grant,
    decode_turn_page,
)
from turnlog.redact import redact, redact_url
from turnlog.schemas.session_keys import grants_as

__all__ = ["ApiResumeSource", "resume_via_api", "resume_via_api_async", "RESPONSE_MARGIN_SECONDS",
           "CONNECT_TIMEOUT_SECONDS"]

logger = logging.getLogger(__name__)

#: How much longer than the barrier's ``timeout`` the client waits for the
#: answer (seconds): the claim's transaction and the transfer of the turns.
RESPONSE_MARGIN_SECONDS = 15.0
#: Longest wait for a connection to the API (seconds).
CONNECT_TIMEOUT_SECONDS = 10.0
#: Bounds on a 429's ``Retry-After`` as the client honours it (seconds).
BUSY_RETRY_MIN_SECONDS, BUSY_RETRY_MAX_SECONDS = 0.1, 30.0
#: The shortest barrier wait worth asking for after a 429 (seconds).
_MIN_RESUME_WAIT_SECONDS = 0.1


class ApiResumeSource:
    """A :class:`~turnlog.producers.grant.ResumeSource` through turnlog's API at ``api_url``
    with the bearer ``token``: :func:`resume_via_api_async` per grant. The recorder's default
    when ``settings.api_url`` is set; it holds no client between resumes, so :meth:`close` has
    nothing to release."""

    def __init__(self, api_url: str, token: SecretStr | str | None) -> None:
        self.api_url = api_url
        self._token = token

    async def grant(self, session_id: str, timeout: float) -> ResumeGrant:
        """:func:`resume_via_api_async`: the same answers and exceptions."""
        return await resume_via_api_async(self.api_url, self._token, session_id, timeout)

    def close(self) -> None:
        """Nothing to release: each resume uses a client of its own."""


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
    every stored turn in ``turn_index`` order (read page by page if the API
    pages them; ``next_after_turn`` is None).

    Raises:
        ResumeUnauthorizedError: no token, or the API does not know it.
        SessionNotFoundError: no such session within the token's fleets.
        SessionClosedError: the session has ended, was finalized or abandoned.
        ResumeBarrierTimeout: the pipeline did not catch up in time, or the API
            did not answer (unreachable, overloaded, timed out), or stayed busy
            (429) for the whole ``timeout``.
        ResumeApiError: any other answer, or a body that is not a grant (or a
            transcript page that does not continue its turns).
        ValueError: ``timeout`` is out of range, or ``session_id`` is empty.
    """
    url, headers, limits = _request(api_url, token, session_id, timeout)
    deadline = time.monotonic() + timeout
    try:
        with httpx.Client(timeout=limits, transport=transport) as client:
            params = {"timeout": repr(float(timeout))}
            while True:
                response = client.post(url, headers=headers, params=params)
                pause = _busy_pause(response, session_id, deadline)
                if pause is None:
                    break
                time.sleep(pause)  # the API asked for it (429 Retry-After), within the call's timeout
                params = _resume_params(deadline, session_id)
            pages = _Pages(_grant_from(response, session_id))
            while (page := pages.next_params()) is not None:
                pages.add(client.get(_transcript_url(api_url, session_id), headers=headers, params=page))
    except httpx.HTTPError as e:
        raise _transport_error(api_url, session_id, e) from e
    return pages.grant()


async def resume_via_api_async(
    api_url: str,
    token: SecretStr | str | None,
    session_id: str,
    timeout: float,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ResumeGrant:
    """:func:`resume_via_api` for an event loop: the same request, answers and exceptions."""
    url, headers, limits = _request(api_url, token, session_id, timeout)
    deadline = time.monotonic() + timeout
    try:
        async with httpx.AsyncClient(timeout=limits, transport=transport) as client:
            params = {"timeout": repr(float(timeout))}
            while True:
                response = await client.post(url, headers=headers, params=params)
                pause = _busy_pause(response, session_id, deadline)
                if pause is None:
                    break
                await asyncio.sleep(pause)  # the API asked for it (429 Retry-After), within the call's timeout
                params = _resume_params(deadline, session_id)
            pages = _Pages(_grant_from(response, session_id))
            while (page := pages.next_params()) is not None:
                pages.add(await client.get(_transcript_url(api_url, session_id), headers=headers, params=page))
    except httpx.HTTPError as e:
        raise _transport_error(api_url, session_id, e) from e
    return pages.grant()


def _request(
    api_url: str, token: SecretStr | str | None, session_id: str, timeout: float
) -> tuple[str, dict[str, str], httpx.Timeout]:
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
    return url, headers, limits


def _resume_params(deadline: float, session_id: str) -> dict[str, str]:
    """The barrier wait to ask for again after a 429: what is left of the call's timeout."""
    left = deadline - time.monotonic()
    if left < _MIN_RESUME_WAIT_SECONDS:
        raise ResumeBarrierTimeout(f"resume of {session_id}: the API stayed busy (429) for the whole timeout")
    return {"timeout": repr(float(left))}


def _busy_pause(response: httpx.Response, session_id: str, deadline: float) -> float | None:
    """How long to wait before asking again after a 429 (its ``Retry-After``, bounded), or
    None for any other answer.

    Raises:
        ResumeBarrierTimeout: the wait would outlast the call's timeout.
    """
    if response.status_code != 429:
        return None
    try:
        pause = float(response.headers.get("Retry-After", "1"))
    except ValueError:  # an HTTP date, or garbage: a second
        pause = 1.0
    pause = min(max(pause, BUSY_RETRY_MIN_SECONDS), BUSY_RETRY_MAX_SECONDS)
    if time.monotonic() + pause + _MIN_RESUME_WAIT_SECONDS >= deadline:
        raise ResumeBarrierTimeout(f"resume of {session_id}: the API is busy (429: {_detail(response)}); retry later")
    return pause


def _transcript_url(api_url: str, session_id: str) -> str:
    return f"{api_url.rstrip('/')}/api/sessions/{quote(session_id, safe='')}/transcript"


class _Pages:
    """A grant and the transcript pages that complete its turns, up to its ``max_turn_index``."""

    def __init__(self, first: ResumeGrant) -> None:
        self._first = first
        self._turns: list[StoredTurn] = list(first.turns)
        self._after = first.next_after_turn

    def next_params(self) -> dict[str, str] | None:
        """The next page's query, or None once every turn up to ``max_turn_index`` is here."""
        last = self._first.max_turn_index
        if self._after is None or last is None or self._after >= last:
            return None
        return {"after_turn": str(self._after), "limit": str(RESUME_TURN_PAGE)}

    def add(self, response: httpx.Response) -> None:
        """Take one transcript page (an answer to :meth:`next_params`' query).

        Raises:
            ResumeApiError: not a page, or a page that does not continue the turns.
            (and the exceptions of a refused resume, for a refused read)
        """
        session_id = self._first.session_id
        if response.status_code != 200:
            raise _refusal(response, session_id)
        try:
            page = decode_turn_page(response.content)
        except msgspec.DecodeError as e:
            raise ResumeApiError(f"resume of {session_id}: the API's transcript page is not one: {e}", 200) from e
        assert self._after is not None and self._first.max_turn_index is not None
        wanted = [t for t in page.turns if self._after < t.turn_index <= self._first.max_turn_index]
        if not wanted or (page.next_after_turn is not None and page.next_after_turn <= self._after):
            raise ResumeApiError(f"resume of {session_id}: the API's transcript page after turn {self._after} "
                                 "does not continue the turns", 200)
        self._turns += wanted
        self._after = page.next_after_turn

    def grant(self) -> ResumeGrant:
        """The grant with every turn read."""
        if self._first.next_after_turn is None:
            return self._first
        return dataclasses.replace(self._first, turns=tuple(self._turns), next_after_turn=None)


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
    if status != 200:
        raise _refusal(response, session_id)
    try:
        grant = decode_grant(response.content)
    except msgspec.DecodeError as e:
        raise ResumeApiError(f"resume of {session_id}: the API's answer is not a resume grant: {e}", status) from e
    if not grants_as(session_id, grant.session_id, grant.fleet):
        raise ResumeApiError(f"resume of {session_id}: the API granted {grant.session_id!r} instead", status)
    logger.info("resume of %s granted by the API: epoch %d, %d stored turns%s", session_id, grant.epoch,
                len(grant.turns), "" if grant.next_after_turn is None else " in its first page")
    return grant


def _refusal(response: httpx.Response, session_id: str) -> Exception:
    """The exception for a non-200 answer (the module docstring's table)."""
    status = response.status_code
    detail = _detail(response)
    if status == 401:
        return ResumeUnauthorizedError(f"resume of {session_id}: the API refused the token (401): {detail}", status)
    if status == 404:
        return SessionNotFoundError(f"no session {session_id} (or not within the token's fleets): {detail}")
    if status == 409:
        return SessionClosedError(f"session {session_id} cannot be resumed: {detail}")
    if status == 410:
        return SessionErasedError(session_id)
    if status in (502, 503, 504):
        retry_after = response.headers.get("Retry-After")
        hint = f"; retry after {retry_after}s" if retry_after else ""
        return ResumeBarrierTimeout(f"resume of {session_id}: the API answered {status}: {detail}{hint}")
    return ResumeApiError(f"resume of {session_id}: the API answered {status}: {detail}", status)
