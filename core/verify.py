"""Compare stores by a per-session digest: ``turnlog verify``.

A session's digest covers what a reader of the store relies on: the session row
(status, fleet, agent, times, end reason, epoch, ``last_seq``, ``end_seq``,
metadata and the finalizer's aggregates) and its turns in ``turn_index`` order
(speaker, text, status, times, tokens, tool calls, and the ``(epoch, seq)`` that
wrote each). Bookkeeping that legitimately differs between two faithful stores
is left out: ``finalized_at`` (when, not what) and ``claimed_epoch`` (epochs
handed out to resumers that may never have written).

Against the log, the reference store is rebuilt from ``<prefix>.events`` by
``turnlog.replay`` into a scratch SQLite database first.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from turnlog.sinks.base import SqlStore
from turnlog.sinks.errors import store_errors
from turnlog.sinks.tables import sessions, transcript_turns

__all__ = ["SessionDigest", "Difference", "session_digests", "compare_digests"]

_SESSION_FIELDS = (
    "status",
    "fleet",
    "agent_id",
    "started_at",
    "ended_at",
    "end_reason",
    "epoch",
    "last_seq",
    "end_seq",
    "turn_count",
    "interrupted_turn_count",
    "duration_seconds",
    "input_tokens",
    "output_tokens",
    "metadata",
)
_TURN_FIELDS = (
    "turn_index",
    "speaker",
    "text",
    "status",
    "started_at",
    "ended_at",
    "input_tokens",
    "output_tokens",
    "tool_calls",
    "epoch",
    "seq",
)


@dataclass(frozen=True, slots=True)
class SessionDigest:
    """One session's canonical content and its SHA-256 (hex)."""

    session_id: str
    fields: dict[str, Any]
    turns: list[dict[str, Any]]
    sha256: str


@dataclass(frozen=True, slots=True)
class Difference:
    """How one session differs between store A and store B (``what``: a short explanation)."""

    session_id: str
    what: str


def _canonical(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def _digest(session_id: str, fields: dict[str, Any], turns: list[dict[str, Any]]) -> SessionDigest:
    body = json.dumps({"session": fields, "turns": turns}, sort_keys=True, separators=(",", ":"), default=str)
    return SessionDigest(session_id, fields, turns, hashlib.sha256(body.encode("utf-8")).hexdigest())


def session_digests(store: SqlStore, session_ids: Collection[str] = ()) -> dict[str, SessionDigest]:
    """``{session_id: digest}`` for every session of ``store`` (or just ``session_ids``).

    Raises:
        StoreError: the store cannot be read.
    """
    wanted = sorted(set(session_ids))
    query = select(sessions.c.id, *(sessions.c[name] for name in _SESSION_FIELDS)).order_by(sessions.c.id)
    turn_query = select(transcript_turns.c.session_id, *(transcript_turns.c[n] for n in _TURN_FIELDS)).order_by(
        transcript_turns.c.session_id, transcript_turns.c.turn_index
    )
    if wanted:
        query = query.where(sessions.c.id.in_(wanted))
        turn_query = turn_query.where(transcript_turns.c.session_id.in_(wanted))
    digests: dict[str, SessionDigest] = {}
    with store_errors(), store.engine.connect() as conn:
        rows = {row.id: {name: _canonical(row._mapping[name]) for name in _SESSION_FIELDS} for row in conn.execute(query)}
        turns: dict[str, list[dict[str, Any]]] = {sid: [] for sid in rows}
        for row in conn.execute(turn_query):
            if row.session_id in turns:
                turns[row.session_id].append({name: _canonical(row._mapping[name]) for name in _TURN_FIELDS})
    for session_id, fields in rows.items():
        digests[session_id] = _digest(session_id, fields, turns[session_id])
    return digests


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
        elif left.sha256 != right.sha256:
            fields = [name for name in _SESSION_FIELDS if left.fields.get(name) != right.fields.get(name)]
            parts = [f"{name}: {left.fields.get(name)!r} != {right.fields.get(name)!r}" for name in fields]
            if len(left.turns) != len(right.turns):
                parts.append(f"turns: {len(left.turns)} != {len(right.turns)}")
            for lt, rt in zip(left.turns, right.turns):
                if lt != rt:
                    changed = [n for n in _TURN_FIELDS if lt.get(n) != rt.get(n)]
                    parts.append(f"turn {lt['turn_index']}: {', '.join(changed)} differ")
                    break
            yield Difference(session_id, "; ".join(parts) or "digest differs")
