"""Errors of the store and the sink."""

from __future__ import annotations

from turnlog.exceptions import TurnlogError

__all__ = [
    "StoreError", "StoreUnavailableError", "RecordRejectedError", "UnsupportedDatabaseError", "StoreAheadOfLogError",
    "SinkFencedError",
]


class StoreError(TurnlogError):
    """Base of store errors."""


class StoreUnavailableError(StoreError):
    """The database did not answer or refused the connection (retryable)."""


class UnsupportedDatabaseError(StoreError):
    """The database URL names a backend turnlog has no store for."""


class RecordRejectedError(StoreError):
    """The database refused the rows for a reason retrying cannot fix (a data
    or integrity error); ``sqlstate`` is the SQLSTATE code when the driver gave one."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class StoreAheadOfLogError(StoreError):
    """The store's offsets for a partition are past the partition's end: the topic was
    deleted and created again, or the broker lost its log, after the store recorded them.
    Consuming on would skip every record below the stored offsets without a word, so
    the sink stops instead.

    Attributes:
        ahead: ``{(topic, partition): (stored offset, end offset)}``.
    """

    def __init__(self, consumer_group: str, ahead: dict[tuple[str, int], tuple[int, int]]) -> None:
        where = ", ".join(f"{t}[{p}] stored {s} > end {e}" for (t, p), (s, e) in sorted(ahead.items()))
        super().__init__(
            f"the store's offsets for consumer group {consumer_group!r} are past the end of the log ({where}):"
            " the topic was recreated or the broker lost its data after they were stored. Nothing was"
            " consumed. To start that group over from the topic's beginning, delete its rows:"
            f" DELETE FROM sink_offsets WHERE consumer_group = '{consumer_group}'; or use a new topic prefix."
        )
        self.ahead = ahead


class SinkFencedError(StoreError):
    """Another sink of the consumer group claimed a partition of the batch after this one did
    (``sink_offsets.owner_generation``): this sink was frozen or cut off past its session
    timeout and its partitions moved. Nothing of the batch was written.

    Attributes:
        fenced: ``{(topic, partition): (generation this sink holds, generation in the store)}``;
            the first is None for a partition this sink never claimed.
    """

    def __init__(self, consumer_group: str, fenced: dict[tuple[str, int], tuple[int | None, int | None]]) -> None:
        where = ", ".join(
            f"{t}[{p}] held {mine}, stored {theirs}" for (t, p), (mine, theirs) in sorted(fenced.items())
        )
        super().__init__(f"consumer group {consumer_group!r}: partitions claimed by a newer assignment ({where})")
        self.fenced = fenced
