"""The producer library: SessionRecorder over confluent-kafka's idempotent producer."""

from turnlog.producers.api_client import ApiResumeSource, resume_via_api, resume_via_api_async
from turnlog.producers.exceptions import (
    InvalidTurnError,
    RecorderError,
    ResumeApiError,
    ResumeBarrierTimeout,
    ResumeUnauthorizedError,
    SessionClosedError,
    SessionErasedError,
    SessionNotFoundError,
    SpoolError,
    SpoolFullError,
)
from turnlog.producers.grant import ResumeGrant, ResumeSource, StoredTurn
from turnlog.producers.partitioning import partition_for
from turnlog.producers.recorder import RecordedSession, SessionRecorder

__all__ = [
    "ApiResumeSource",
    "InvalidTurnError",
    "RecordedSession",
    "RecorderError",
    "ResumeApiError",
    "ResumeBarrierTimeout",
    "ResumeGrant",
    "ResumeSource",
    "ResumeUnauthorizedError",
    "SessionClosedError",
    "SessionErasedError",
    "SessionNotFoundError",
    "SessionRecorder",
    "SpoolError",
    "SpoolFullError",
    "StoredTurn",
    "partition_for",
    "resume_via_api",
    "resume_via_api_async",
]
