"""Compare stores by a per-session digest: ``turnlog verify``.

A session's digest covers what a reader of the store relies on: the session row
(status, fleet, agent, times, end reason, epoch, ``last_seq``, ``end_seq``,
metadata and the finalizer's aggregates), its turns in ``turn_index`` order
(speaker, text, status, ``barged_in``, times, tokens, tool calls, and the
``(epoch, seq)`` that wrote each), and its event log in seq order (seq, epoch, type and the SHA-256
of the exact payload: what the SSE stream serves). A session with turns or
events but no session row is compared too. Bookkeeping that legitimately differs between two faithful stores
is left out: ``finalized_at`` (when, not what) and ``claimed_epoch`` (epochs
handed out to resumers that may never have written).

Against the log, the reference store is rebuilt from ``<prefix>.events`` by
``turnlog.ops.replay`` into a scratch SQLite database first (records it cannot
decode or sequence are skipped and counted there, never fatal).

A session whose stored content cannot be serialized for its digest (a value
nested too deep, from a store written before the event model bounded its
free-form values) is reported as differing, with why; the others are compared.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from turnlog.sinks.base import SqlStore
from turnlog.sinks.reads import SESSION_FIELDS, TURN_FIELDS

__all__ = ["SessionDigest", "Difference", "session_digests", "compare_digests", "erased_session_ids"]

logger = logging.getLogger(__name__)

# What the digest covers: what readers see, less the id (the key) and when it was finalized.
_SESSION_FIELDS = tuple(name for name in SESSION_FIELDS if name not in ("id", "finalized_at"))
_TURN_FIELDS = TURN_FIELDS


@dataclass(frozen=True, slots=True)
class SessionDigest:
    """One session's canonical content and its SHA-256 (hex)."""

    session_id: str
    fields: dict[str, Any]
    turns: list[dict[str, Any]]
    sha256: str
    events: list[list[Any]] | None = None
    #: Why the session's content could not be digested (e.g. ``RecursionError``: a stored value
    #: nested too deep); None when ``sha256`` is its digest. Such a session always differs.
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Difference:
    """How one session differs between store A and store B (``what``: a short explanation)."""

    session_id: str
    what: str


def _canonical(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def _digest(
    session_id: str, fields: dict[str, Any], turns: list[dict[str, Any]], events: list[list[Any]]
) -> SessionDigest:
    """The session's digest; one whose content cannot be serialized gets ``error`` instead
    (logged with the session id, never the content), so the other sessions are still compared."""
    try:
        body = json.dumps({"session": fields, "turns": turns, "events": events}, sort_keys=True,
                          separators=(",", ":"), default=str)
    except Exception as e:  # one session's stored values (e.g. nested too deep) must not stop the comparison
        logger.warning("session %s cannot be digested (%s)", session_id, type(e).__name__)
        return SessionDigest(session_id, fields, turns, "", events, error=type(e).__name__)
    return SessionDigest(session_id, fields, turns, hashlib.sha256(body.encode("utf-8")).hexdigest(), events)


def erased_session_ids(store: SqlStore, session_ids: Collection[str] = ()) -> set[str]:
    """The sessions ``store`` holds as forgotten or being forgotten (an ``erasures`` row of the
    session's own fleet), of ``session_ids`` if given: a comparison leaves them out of both sides.

    Raises:
        StoreError: the store cannot be read.
    """
    with store.reading() as reads:
        return reads.erased_sessions(session_ids)


def session_digests(store: SqlStore, session_ids: Collection[str] = ()) -> dict[str, SessionDigest]:
    """``{session_id: digest}`` for every session of ``store`` (or just ``session_ids``).

    Raises:
        StoreError: the store cannot be read.
    """
    with store.reading() as reads:
        snapshot = reads.snapshot(session_ids, _SESSION_FIELDS, _TURN_FIELDS)
    rows = {sid: {name: _canonical(value) for name, value in row.items()} for sid, row in snapshot.sessions.items()}
    turns = {
        sid: [{name: _canonical(value) for name, value in turn.items()} for turn in session_turns]
        for sid, session_turns in snapshot.turns.items()
    }
    events = {
        sid: [[seq, epoch, kind, hashlib.sha256(payload.encode("utf-8")).hexdigest()]
              for seq, epoch, kind, payload in session_events]
        for sid, session_events in snapshot.events.items()
    }
    ids = sorted(set(rows) | set(turns) | set(events))
    return {
        sid: _digest(sid, rows.get(sid, {"row": "missing"}), turns.get(sid, []), events.get(sid, []))
        for sid in ids
    }


def compare_digests(a: dict[str, SessionDigest], b: dict[str, SessionDigest]) -> list[Difference]:
    """Every session whose digest differs between ``a`` and ``b``, with what differs, by id."""
    return sorted(_differences(a, b), key=lambda d: d.session_id)


def _differences(a: dict[str, SessionDigest], b: dict[str, SessionDigest]) -> Iterator[Difference]:
    for session_id in sorted(set(a) | set(b)):
        left, right = a.get(session_id), b.get(session_id)
        if left is None:
            yield Difference(session_id, "only in B")
        elif right is None:
            yield Difference(session_id, "only in A")
        elif left.error is not None or right.error is not None:
            sides = [f"in {side} ({d.error})" for side, d in (("A", left), ("B", right)) if d.error is not None]
            yield Difference(session_id, "cannot be digested " + " and ".join(sides))
        elif left.sha256 != right.sha256:
            if "row" in left.fields or "row" in right.fields:
                parts = [f"session row missing in {'A' if 'row' in left.fields else 'B'}"]
            else:
                fields = [name for name in _SESSION_FIELDS if left.fields.get(name) != right.fields.get(name)]
                parts = [f"{name}: {left.fields.get(name)!r} != {right.fields.get(name)!r}" for name in fields]
            if len(left.turns) != len(right.turns):
                parts.append(f"turns: {len(left.turns)} != {len(right.turns)}")
            for lt, rt in zip(left.turns, right.turns, strict=False):  # a count that differs is reported above
                if lt != rt:
                    changed = [n for n in _TURN_FIELDS if lt.get(n) != rt.get(n)]
                    parts.append(f"turn {lt['turn_index']}: {', '.join(changed)} differ")
                    break
            left_events, right_events = left.events or [], right.events or []
            if [e[0] for e in left_events] != [e[0] for e in right_events]:
                missing = sorted({e[0] for e in right_events} - {e[0] for e in left_events})
                extra = sorted({e[0] for e in left_events} - {e[0] for e in right_events})
                sides = [f"only in A {extra[:5]}" if extra else "", f"only in B {missing[:5]}" if missing else ""]
                parts.append("events: seqs " + ", ".join(side for side in sides if side))
            else:
                changed_seqs = [a[0] for a, b in zip(left_events, right_events, strict=True) if a != b]
                if changed_seqs:
                    parts.append(f"events: {len(changed_seqs)} differ, first at seq {changed_seqs[0]}")
            yield Difference(session_id, "; ".join(parts) or "digest differs")
