"""Errors of the producer library (SessionRecorder)."""

from __future__ import annotations

from turnlog.exceptions import TurnlogError

__all__ = [
    "RecorderError",
    "InvalidTurnError",
    "SessionClosedError",
    "SessionErasedError",
    "SessionNotFoundError",
    "ResumeBarrierTimeout",
    "ResumeApiError",
    "ResumeUnauthorizedError",
    "SpoolError",
    "SpoolFullError",
]


class RecorderError(TurnlogError):
    """Base of the recorder's errors."""


class InvalidTurnError(RecorderError, ValueError):
    """A turn's values are wrong (type, range, size); nothing was sent."""


class SessionClosedError(RecorderError):
    """The session has ended (or was never opened here); nothing was sent."""


class SessionErasedError(SessionClosedError):
    """The session was forgotten (``turnlog forget``, ``DELETE /api/sessions/{id}``, the
    retention sweep: its record in the erasure ledger ``<prefix>.erasures``): nothing more of it
    is recorded, and what this host's spool held of it undelivered was dropped. The message
    names the session, never content; ``session_id`` is the session."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"session {session_id} was forgotten (erasure ledger); nothing more of it is recorded, and its "
            "undelivered events were dropped from this host's spool"
        )
        self.session_id = session_id


class SessionNotFoundError(RecorderError):
    """resume() found no such session in the store."""


class ResumeBarrierTimeout(RecorderError, TimeoutError):
    """resume() waited longer than its timeout for the pipeline to catch up, or
    the store or turnlog's API did not answer in time (retry later).

    ``undelivered_events``: events of the session still held in this host's
    spools (this recorder's or another live recorder's) when resume() gave up;
    0 when the wait was for the pipeline, the store or the API.
    """

    def __init__(self, message: str, undelivered_events: int = 0) -> None:
        super().__init__(message)
        self.undelivered_events = undelivered_events


class ResumeApiError(RecorderError):
    """turnlog's API answered a resume in a way retrying will not fix (an
    unexpected status or body); ``status_code`` is the HTTP status, if any."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ResumeUnauthorizedError(ResumeApiError):
    """turnlog's API refused the recorder's bearer token (HTTP 401): it is
    missing or unknown there (``TURNLOG_API_TOKEN``)."""


class SpoolError(RecorderError):
    """The local spool cannot be written or read (a full disk, a read-only volume)."""


class SpoolFullError(SpoolError):
    """The spool holds ``TURNLOG_SPOOL_MAX_BYTES`` already; the event was not
    recorded, and nothing already spooled is lost. It clears as the broker
    acknowledges spooled events."""
