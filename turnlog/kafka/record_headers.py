"""A record's headers as confluent-kafka reads them, or why they cannot be read.

Kafka does not validate header names: any writer of a topic can give a record
a header name that is not UTF-8 (the Java broker accepts it). aiokafka cannot
unpack the fetched batch at all (``stream_processors/fetching.py``), and
confluent-kafka (2.x, ``c_headers_to_py``) returns the headers with the
``UnicodeDecodeError`` still set: a checked call raises ``SystemError``, but
an ordinary ``message.headers()`` at a call site CPython has specialised
returns the list (its name a NULL) and leaves the error set, to surface later
at an unrelated line. :func:`read_headers` calls it the checked way, once per
message (the message keeps the broken list), so every turnlog reader of
``<prefix>.events`` refuses such a record alone (the sequencer dead-letters it,
the replay skips it) instead of stopping.
"""

from __future__ import annotations

from operator import methodcaller
from typing import Any

__all__ = ["UnreadableHeaders", "read_headers", "NOT_UTF8_NAME"]

#: Why the headers of a record whose header name is not UTF-8 cannot be read.
NOT_UTF8_NAME = "a header name is not UTF-8"
#: ``message.headers()`` through the C API's checked call, whatever the interpreter specialises.
_headers_of = methodcaller("headers")


class UnreadableHeaders(tuple[tuple[str, bytes], ...]):
    """Stands for the headers of a record whose headers cannot be read: no headers at all
    (an empty tuple, so code that iterates headers sees none), and ``reason``, why.

    A reader that sees it refuses the record (a refusal of that record alone); it is never
    read as "no headers", which would admit an unsigned record in open mode differently
    from the path that re-reads it."""

    reason: str

    def __new__(cls, reason: str) -> UnreadableHeaders:
        headers = super().__new__(cls, ())
        headers.reason = reason
        return headers

    def __repr__(self) -> str:
        return f"UnreadableHeaders({self.reason!r})"


def read_headers(message: Any) -> list[tuple[str, bytes]] | None | UnreadableHeaders:
    """``message.headers()`` of a confluent-kafka ``Message`` (a list of ``(name, value)``,
    or None), or :class:`UnreadableHeaders` when they cannot be decoded. Never raises for
    what the record holds. Call it once per message: after a failure the message holds
    a broken list, which only this call must have seen."""
    try:
        headers: list[tuple[str, bytes]] | None = _headers_of(message)
        return headers
    except Exception as e:  # the record's own failure (confluent-kafka: SystemError from a UnicodeDecodeError)
        if isinstance(e, UnicodeDecodeError) or isinstance(e.__cause__ or e.__context__, UnicodeDecodeError):
            return UnreadableHeaders(NOT_UTF8_NAME)
        return UnreadableHeaders(f"its headers cannot be decoded ({type(e).__name__})")
