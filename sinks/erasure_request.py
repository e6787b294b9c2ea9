"""Forgetting a session on request: ``turnlog forget`` and ``DELETE /api/sessions/{id}``.

docs/design.md, "Encryption and erasure". :func:`request_erasure`:

1. In the store: the session must exist within the caller's fleets (else
   :class:`ErasureNotFound`: the API's 404; nothing changes). Its erasure row
   is inserted as pending, or the one already there is taken (asking twice is
   one erasure, whoever asked first stays its ``requested_by``).
2. Its ledger record goes to ``<prefix>.erasures`` and, once acknowledged, the
   row is marked published. A broker that does not answer leaves it pending:
   the sink publishes it when the broker is back.
3. It waits for the sink to have applied it, until ``wait_seconds`` after the call.

A store that does not answer: with the session's fleet given (the CLI's
``--fleet``) the ledger record is written alone and the sink applies it when
the store is back; without it, :class:`~turnlog.sinks.exceptions.StoreUnavailableError`
(nothing changed). Either way the answer says ``pending`` until the store
holds the erasure done.

It lives with the store (not with the operator tools) because the API, which
may not import ``turnlog.ops``, runs it too; ``turnlog.ops.erasure`` re-exports it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from confluent_kafka import Producer
from sqlalchemy import select

from turnlog import kafka
from turnlog.crypto.ledger_signatures import ledger_signer
from turnlog.exceptions import TurnlogError
from turnlog.faults import fault_point
from turnlog.schemas.erasure import Erasure, ErasureReason
from turnlog.schemas.session_keys import SessionKeyError, in_namespace, session_key
from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import SqlStore
from turnlog.sinks.driver_errors import store_errors
from turnlog.sinks.erasure import ErasureStatus
from turnlog.sinks.erasure_ledger import publish_erasures
from turnlog.sinks.exceptions import StoreUnavailableError
from turnlog.sinks.tables import sessions

__all__ = ["ErasureNotFound", "ErasureOutcome", "request_erasure"]

#: How often request_erasure looks whether the sink has applied the erasure (seconds).
_POLL_SECONDS = 0.2


class ErasureNotFound(TurnlogError):
    """No such session within the caller's fleets (and no erasure of it): nothing changed."""


@dataclass(frozen=True, slots=True)
class ErasureOutcome:
    """Where an erasure stands. ``status``: ``done`` (the store holds nothing of the session)
    or ``pending``; ``published``: its ledger record was acknowledged by the broker;
    ``completed_at``: when the store applied it (None while pending)."""

    session_id: str
    fleet: str
    status: ErasureStatus
    published: bool
    requested_at: dt.datetime
    requested_by: str
    completed_at: dt.datetime | None = None


def request_erasure(
    settings: TurnlogSettings,
    store: SqlStore,
    session_id: str,
    *,
    requested_by: str,
    fleets: Collection[str] | None = None,
    fleet: str | None = None,
    reason: ErasureReason = "request",
    wait_seconds: float = 10.0,
    producer: Producer | None = None,
    on_recorded: Callable[[ErasureOutcome], object] | None = None,
    unstored: bool = False,
) -> ErasureOutcome:
    """Forget ``session_id`` everywhere (module docstring).

    ``session_id``: the session's key; with ``fleet``, also the id the fleet's agent gave it:
    then every session of the fleet it names is forgotten, its key ``<fleet>:<session_id>`` and
    the bare id of one from before per-fleet keys (:func:`_targets_in_fleet`), and the outcome is
    the first one still pending, else the first (the stored bare id before the key).
    ``fleets``: the fleets the caller may erase in (None: any);
    ``fleet``: the session's fleet, used when the store does not answer, and, with ``unstored``,
    when the store does not hold the session (it may be only in agents' spools or
    in flight: the CLI's ``--fleet``; the API never does this). ``wait_seconds``
    counts from the call: it returns by then, or once the ledger record's
    publication gives up (``max(1, 5 * ack_wait_seconds)`` s) if that is later.
    ``on_recorded`` is called (in the caller's thread) with the pending outcome as
    soon as the erasure is queued, in the store or in the ledger, so that a caller
    that stops waiting knows it will complete (the API's 202).

    Raises:
        ErasureNotFound: the store has neither the session within ``fleets`` nor an erasure of it.
        StoreUnavailableError: the store does not answer and ``fleet`` was not given.
    """
    deadline = time.monotonic() + wait_seconds
    targets = _targets_in_fleet(store, fleet, session_id) if fleet is not None else [session_id]
    outcomes = [
        _erase(settings, store, target, requested_by=requested_by, fleets=fleets, fleet=fleet, reason=reason,
               deadline=deadline, producer=producer, on_recorded=on_recorded, unstored=unstored)
        for target in targets
    ]
    return next((outcome for outcome in outcomes if outcome.status != "done"), outcomes[0])


def _erase(
    settings: TurnlogSettings,
    store: SqlStore,
    session_id: str,
    *,
    requested_by: str,
    fleets: Collection[str] | None,
    fleet: str | None,
    reason: ErasureReason,
    deadline: float,
    producer: Producer | None,
    on_recorded: Callable[[ErasureOutcome], object] | None,
    unstored: bool,
) -> ErasureOutcome:
    """:func:`request_erasure` of the one session keyed ``session_id``, waiting up to ``deadline`` (monotonic)."""
    now = dt.datetime.now(dt.UTC)
    signer = ledger_signer(settings)
    if signer is not None:
        requested_by = signer.requested_by(requested_by)
    store_answered = True
    try:
        erasure, published = _recorded(store, session_id, fleets, requested_by, reason, now,
                                       unstored_fleet=fleet if unstored else None)
    except StoreUnavailableError:
        if fleet is None or (fleets is not None and fleet not in fleets):
            raise
        store_answered, published = False, False
        erasure = Erasure(session_id=session_id, fleet=fleet, requested_by=requested_by, requested_at=now,
                          reason=reason)
    else:
        _tell(on_recorded, erasure, published)
    fault_point("forget.after_request")
    if not published:
        own = producer is None
        producer = producer or kafka.producer(settings, client_id=f"turnlog-forget-{session_id[:40]}")
        try:
            acked = publish_erasures(producer, settings, [erasure], timeout=max(1.0, settings.ack_wait_seconds * 5),
                                     signer=signer)
        finally:
            if own:
                producer.flush(0)
        published = bool(acked)
        if published and not store_answered:
            _tell(on_recorded, erasure, published)
        if published and store_answered:
            try:
                with store_errors(), store.engine.begin() as conn:
                    store.erasures.mark_published(conn, acked, dt.datetime.now(dt.UTC))
            except StoreUnavailableError:
                pass  # the sink marks it when it applies the record
    status: ErasureStatus = "pending"
    completed_at = None
    while True:
        try:
            with store_errors(), store.engine.connect() as conn:
                state = store.erasures.state(conn, session_id, [erasure.fleet])
        except StoreUnavailableError:
            state = None
        if state is not None and state.status == "done":
            status, completed_at = "done", state.completed_at
            break
        if time.monotonic() >= deadline:
            break
        time.sleep(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
    return ErasureOutcome(session_id, erasure.fleet, status, published, erasure.requested_at, erasure.requested_by,
                          completed_at)


def _targets_in_fleet(store: SqlStore, fleet: str, session_id: str) -> list[str]:
    """The keys of ``fleet``'s sessions that ``session_id`` names (``schemas/session_keys.py``), the
    stored ones first.

    ``session_id`` that begins with ``<fleet>:`` is a key, named as it is. Any other is the id the
    fleet's agent gave: its key ``<fleet>:<session_id>``, and the bare id of the fleet's session from
    before per-fleet keys, so both are forgotten. The store says which of them it holds; an unstored
    session (only in spools or in flight) is under its key. A store that does not answer: both, each
    bound to ``fleet`` (forgetting one that never existed changes nothing of another fleet's)."""
    if in_namespace(fleet, session_id):
        return [session_id]
    try:
        key = session_key(fleet, session_id)
    except SessionKeyError:
        return [session_id]  # no key of the fleet can be this id: only a bare id from before keys can
    try:
        with store_errors(), store.engine.connect() as conn:
            held = set(conn.execute(
                select(sessions.c.id).where(sessions.c.id.in_([session_id, key]), sessions.c.fleet == fleet)
            ).scalars())
    except StoreUnavailableError:
        return [key, session_id]
    return [target for target in (session_id, key) if target in held] or [key]


def _tell(on_recorded: Callable[[ErasureOutcome], object] | None, erasure: Erasure, published: bool) -> None:
    if on_recorded is not None:
        on_recorded(ErasureOutcome(erasure.session_id, erasure.fleet, "pending", published, erasure.requested_at,
                                   erasure.requested_by))


def _recorded(
    store: SqlStore, session_id: str, fleets: Collection[str] | None, requested_by: str, reason: ErasureReason,
    now: dt.datetime, *, unstored_fleet: str | None = None,
) -> tuple[Erasure, bool]:
    """The erasure of ``session_id`` as the store holds it (inserted as pending if new) and
    whether its ledger record was published already. A session the store does not hold is
    :class:`ErasureNotFound`, unless ``unstored_fleet`` names its fleet (within ``fleets``).

    Raises:
        ErasureNotFound, StoreUnavailableError: as :func:`request_erasure`.
    """
    with store_errors(), store.engine.begin() as conn:
        stored = conn.execute(select(sessions.c.id, sessions.c.fleet).where(sessions.c.id == session_id)).first()
        # The stored session's erasure, or (none stored) one within the caller's fleets: an erasure
        # is bound to its fleet, another fleet's erasure of the same id is not this session's.
        if stored is not None and stored.fleet is not None:
            scope: Collection[str] | None = [stored.fleet]
        else:
            scope = [unstored_fleet] if unstored_fleet is not None else fleets
        state = store.erasures.state(conn, session_id, scope)
        if state is not None:
            if fleets is not None and state.fleet not in fleets:
                raise ErasureNotFound(f"no session {session_id}")
            return state.as_erasure(), state.published_at is not None
        fleet: str | None = unstored_fleet if stored is None else stored.fleet
        if fleet is None or (fleets is not None and fleet not in fleets):
            raise ErasureNotFound(f"no session {session_id}")
        erasure = Erasure(session_id=session_id, fleet=fleet, requested_by=requested_by, requested_at=now,
                          reason=reason)
        if not store.erasures.request(conn, erasure):  # a concurrent request inserted it first: that one stands
            raced = store.erasures.state(conn, session_id, [fleet])
            if raced is not None:
                return raced.as_erasure(), raced.published_at is not None
        return erasure, False
