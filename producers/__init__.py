"""The producer library: SessionRecorder over confluent-kafka's idempotent producer."""

from turnlog.producers.exceptions import (
    DeliveryError,
    InvalidTurnError,
    RecorderError,
    ResumeBarrierTimeout,
    SessionClosedError,
    SessionNotFoundError,
)
from turnlog.producers.partitioning import partition_for
from turnlog.producers.recorder import RecordedSession, SessionRecorder

__all__ = [
    "DeliveryError",
    "InvalidTurnError",
    "RecordedSession",
    "RecorderError",
    "ResumeBarrierTimeout",
    "SessionClosedError",
    "SessionNotFoundError",
    "SessionRecorder",
    "partition_for",
]
