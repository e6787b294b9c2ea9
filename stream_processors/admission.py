"""The sequencer's write-side admission: which fleet may write a session, at which epoch (pure logic).

Runs for every record of ``<prefix>.events`` once fleet keys are configured
(``turnlog/signing.py`` has the keys, the headers and the grant tokens;
docs/design.md, "Write-side isolation", the rules), in two steps:

:func:`authenticate`, before the record is decoded (an HMAC costs less than
decoding, so junk is refused at the cheapest point):

1. the record is signed by a fleet whose key the sequencer holds;

:func:`admit`, once it is decoded, against the session's state:

2. a ``session.started`` names the fleet that signed it;
3. a session belongs to one fleet, its *owner*. A key in a fleet's namespace
   (``<fleet>:<id>``, ``schemas/session_keys.py``) is that fleet's from its
   first record on, whichever seq comes first (a range the consumer skipped
   and the gap re-read brings back later, a replay from a time), and no other
   fleet can write it. A bare id (a recorder from before per-fleet keys) is
   owned by the signer of its admitted ``session.started`` (seq 0, epoch 0);
   until then nothing else of it is admitted, so no record can take an id by
   arriving first with a later seq. Any other fleet's record of an owned
   session is refused (never merged). A bare-id session whose state predates fleet keys (no owner, but
   sequenced) is taken over only through a resume, whose epoch grant names
   the fleet the store holds for it;
4. an epoch above 0 carries an epoch grant issued for exactly this fleet,
   session and epoch, and the event's seq is at or above the grant's first
   seq: no record can fence a session or rewrite a stored seq with an epoch
   nobody issued.

In open mode (no keys; ``TURNLOG_INSECURE_OPEN_FLEETS``) nothing is
authenticated, but :func:`note_owner` still keeps the fleet of each session's
applied ``session.started`` (so sessions started then have their owner once keys
are turned on), and :func:`admit_open` checks what a record claims
(``turnlog.signing.claim_headers``): a record claiming another fleet than its
session's owner is refused (an honest collision of ids, never merged), a
``session.started`` must name the fleet it claims, and with an epoch grant key
an epoch above 0 needs an issued grant as in rule 4.

A refused record goes to the DLQ with the reason returned here; the reasons
name sessions, seqs and epochs, never fleets' keys or content.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Mapping
from typing import Any

from turnlog.exceptions import ConfigurationError
from turnlog.schemas import Event, SessionStarted
from turnlog.schemas.session_keys import key_namespace
from turnlog.settings import TurnlogSettings
from turnlog.signing import (
    EPOCH_GRANT_HEADER,
    FLEET_HEADER,
    ProvenanceError,
    RecordVerifier,
    VerifiedRecord,
    provenance_headers,
    verify_epoch_grant,
)
from turnlog.stream_processors.sequencing import SessionSequence

__all__ = ["authenticate", "admit", "admit_open", "note_owner", "record_verifier", "open_mode_grant_key"]

logger = logging.getLogger(__name__)


def authenticate(verifier: RecordVerifier, key: bytes | None, raw: bytes, headers: Any) -> VerifiedRecord:
    """The fleet that signed the record (and the epoch grant it carries), checked before decoding.

    ``headers``: the record's headers as the Kafka client gives them (a list of
    pairs, a mapping, or None).

    Raises:
        ProvenanceError: unsigned, signed by a fleet without a key here, a
            signature that does not verify, a repeated provenance header, or an
            epoch grant not issued with the issuer's key.
    """
    return verifier.verify(provenance_headers(headers), key or b"", raw)


def _fresh(state: SessionSequence) -> bool:
    """Nothing of the session was ever sequenced (its state is the default one)."""
    return state.next_seq == 0 and state.epoch == 0 and not state.buffer and not state.ended


def admit(verified: VerifiedRecord, state: SessionSequence, event: Event, *, fleets: Container[str]) -> str | None:
    """Check one authenticated, decoded record against the session's owner and the issued epochs.

    ``fleets``: every fleet whose records verify here (``RecordVerifier.fleets``): a new session
    whose key is in one of their namespaces (``<fleet>:<id>``) is that fleet's alone.
    Returns the reason to refuse it (for the DLQ), or None when it is admitted.
    Admitting the ``session.started`` of a fresh session, or a granted epoch of
    a session from before fleet keys, makes the signer the owner
    (``state.fleet``).
    """
    session_id = event.session_id
    if isinstance(event, SessionStarted) and event.fleet != verified.fleet:
        return f"forged fleet: session.started of {session_id} names a fleet other than its signer"
    namespace = key_namespace(session_id)
    keyed_by = namespace if namespace is not None and namespace in fleets else None
    if keyed_by is not None and keyed_by != verified.fleet:
        return f"foreign fleet: session key {session_id} is in another fleet's namespace"
    if state.fleet is not None and state.fleet != verified.fleet:
        return f"foreign fleet: session id {session_id} belongs to another fleet"
    if event.epoch > 0:
        grant = verified.grant
        if grant is None:
            return f"epoch not issued: epoch {event.epoch} of {session_id} carries no epoch grant"
        if (grant.fleet, grant.session_id, grant.epoch) != (verified.fleet, session_id, event.epoch):
            return f"epoch not issued: the epoch grant is not for epoch {event.epoch} of {session_id}"
        if event.seq < grant.from_seq:
            return (
                f"epoch not issued: seq {event.seq} is below seq {grant.from_seq}, "
                f"the first granted to epoch {event.epoch}"
            )
    if state.fleet is None:
        # A key in a fleet's namespace names its owner, the signer (checked above): any of its
        # records may come first. A bare id is opened by its start, or taken over by a resume.
        if keyed_by is None and _fresh(state):
            if not (isinstance(event, SessionStarted) and event.seq == 0 and event.epoch == 0):
                return (
                    f"no owner: {session_id} has no admitted session.started; seq {event.seq} "
                    f"(epoch {event.epoch}) cannot open it"
                )
        elif keyed_by is None and verified.grant is None:
            return f"no owner: {session_id} was started before fleet keys; it continues only through a resume"
        state.fleet = verified.fleet
    return None


def admit_open(claimed: Mapping[str, bytes], grant_key: bytes | None, state: SessionSequence,
               event: Event) -> str | None:
    """Open mode's checks of what a record claims (``claimed``: its provenance headers, unsigned).

    Returns the reason to refuse it (for the DLQ), or None. A record that claims no fleet (a
    recorder of an older release, which sent no claim and no grant in open mode) is not checked.
    """
    session_id = event.session_id
    fleet_bytes = claimed.get(FLEET_HEADER)
    fleet = fleet_bytes.decode("utf-8", "replace") if fleet_bytes is not None else None
    if fleet is not None:
        if isinstance(event, SessionStarted) and event.fleet != fleet:
            return f"forged fleet: session.started of {session_id} names a fleet other than the one it claims"
        if state.fleet is not None and state.fleet != fleet:
            return f"foreign fleet: session id {session_id} belongs to another fleet"
    if event.epoch > 0 and grant_key is not None and fleet is not None:
        token = claimed.get(EPOCH_GRANT_HEADER)
        if token is None:
            return f"epoch not issued: epoch {event.epoch} of {session_id} carries no epoch grant"
        try:
            grant = verify_epoch_grant(grant_key, token)
        except ProvenanceError:
            return f"epoch not issued: the epoch grant of epoch {event.epoch} of {session_id} does not verify"
        owner = state.fleet or fleet
        if (grant.session_id, grant.epoch) != (session_id, event.epoch) or (owner is not None and grant.fleet != owner):
            return f"epoch not issued: the epoch grant is not for epoch {event.epoch} of {session_id}"
        if event.seq < grant.from_seq:
            return (
                f"epoch not issued: seq {event.seq} is below seq {grant.from_seq}, "
                f"the first granted to epoch {event.epoch}"
            )
    return None


def note_owner(state: SessionSequence, event: Event) -> None:
    """Open mode: keep the fleet of the session's ``session.started`` once it is applied (sequenced)."""
    if state.fleet is None and isinstance(event, SessionStarted) and state.started_event_id == str(event.event_id):
        state.fleet = event.fleet


def record_verifier(settings: TurnlogSettings) -> RecordVerifier | None:
    """The write-side admission's verifier (``turnlog/signing.py``), or None in open mode (no fleet keys).

    Raises:
        ConfigurationError: fleet keys without ``epoch_grant_key`` (no resumed epoch could be admitted).
    """
    if not settings.fleet_keys:
        if not settings.insecure_open_fleets:
            raise ConfigurationError(
                "TURNLOG_FLEET_KEYS is empty: without fleet keys any writer of the events topic can write any "
                "session. Set TURNLOG_FLEET_KEYS (and TURNLOG_EPOCH_GRANT_KEY; docs/security.md), or "
                "TURNLOG_INSECURE_OPEN_FLEETS=true to run open knowingly"
            )
        logger.warning(
            "TURNLOG_INSECURE_OPEN_FLEETS: records are not authenticated, and any writer of %s can write, "
            "fence or take over any session (open mode; see docs/design.md, 'Write-side isolation')",
            settings.topics.events,
        )
        return None
    if settings.epoch_grant_key is None:
        raise ConfigurationError(
            "TURNLOG_FLEET_KEYS is set but TURNLOG_EPOCH_GRANT_KEY is not: the sequencer could not admit any "
            "resumed epoch"
        )
    return RecordVerifier(settings.fleet_key_rings(), settings.epoch_grant_key.get_secret_value())


def open_mode_grant_key(settings: TurnlogSettings) -> bytes | None:
    """The epoch grant key :func:`admit_open` checks resumed epochs with (None: not set)."""
    key = settings.epoch_grant_key
    return key.get_secret_value().encode("utf-8") if key is not None else None
