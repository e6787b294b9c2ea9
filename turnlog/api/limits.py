"""Concurrency caps of the HTTP API: a global cap and a cap per token.

The API holds two: resumes (each one a resume worker's thread, running or
queued) and live event streams (each one an SSE follower). A request past
either cap is answered 429 with ``Retry-After`` before it costs anything.
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["SlotLimiter"]


class SlotLimiter:
    """At most ``total`` slots held at once, and at most ``per_key`` by one key (a token's number).

    Thread-safe: slots are taken on the event loop and may be released from a
    worker thread (a resume's worker finishing after its request was answered).
    """

    def __init__(self, total: int, per_key: int) -> None:
        if total < 1 or per_key < 1:
            raise ValueError(f"limits must be at least 1, not total={total}, per_key={per_key}")
        self.total = total
        self.per_key = per_key
        self._held: Counter[int] = Counter()
        self._lock = threading.Lock()

    def try_acquire(self, key: int) -> bool:
        """Take a slot for ``key``; False (nothing taken) if ``key`` or everyone is at the cap."""
        with self._lock:
            if self._held[key] >= self.per_key or self._held.total() >= self.total:
                return False
            self._held[key] += 1
            return True

    def release(self, key: int) -> None:
        """Give back one slot of ``key`` (one per successful :meth:`try_acquire`)."""
        with self._lock:
            if self._held[key] <= 0:
                raise RuntimeError(f"slot of key {key} released more often than acquired")
            self._held[key] -= 1
            if not self._held[key]:
                del self._held[key]

    def held(self, key: int | None = None) -> int:
        """Slots held by ``key``, or by everyone (None)."""
        with self._lock:
            return self._held.total() if key is None else self._held[key]
