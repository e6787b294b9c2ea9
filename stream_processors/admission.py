"""The sequencer's write-side admission: which fleet may write a session, at which epoch (pure logic).

Runs before :func:`~turnlog.stream_processors.sequencing.sequence` for every
record of ``<prefix>.events`` once fleet keys are configured
(``turnlog/signing.py`` has the keys, the headers and the grant tokens;
docs/design.md, "Write-side isolation", the rules):

1. the record is signed by a fleet whose key the sequencer holds;
2. a ``session.started`` names the fleet that signed it;
3. a session belongs to the fleet that signed its first admitted record; any
   other fleet's record of the same session id is refused (never merged);
4. an epoch above 0 carries an epoch grant issued for exactly this fleet,
   session and epoch, and the event's seq is at or above the grant's first
   seq: no record can fence a session or rewrite a stored seq with an epoch
   nobody issued.

A refused record goes to the DLQ with the reason returned here; the reasons
name sessions, seqs and epochs, never fleets' keys or content.
"""

from __future__ import annotations

from typing import Any

from turnlog.schemas import Event, SessionStarted
from turnlog.signing import ProvenanceError, RecordVerifier, provenance_headers
from turnlog.stream_processors.sequencing import SessionSequence

__all__ = ["admit"]


def admit(
    verifier: RecordVerifier, state: SessionSequence, event: Event, key: bytes, raw: bytes, headers: Any,
) -> str | None:
    """Check one decoded record against the session's owner and the issued epochs.

    Returns the reason to refuse it (for the DLQ), or None when it is admitted;
    an admitted record of a session without an owner makes its fleet the owner
    (``state.fleet``). ``headers``: the record's headers as the Kafka client
    gives them (a list of pairs, a mapping, or None).
    """
    try:
        verified = verifier.verify(provenance_headers(headers), key, raw)
    except ProvenanceError as e:
        return f"unauthenticated: {e.reason}"
    if isinstance(event, SessionStarted) and event.fleet != verified.fleet:
        return f"forged fleet: session.started of {event.session_id} names a fleet other than its signer"
    if state.fleet is not None and state.fleet != verified.fleet:
        return f"foreign fleet: session id {event.session_id} belongs to another fleet"
    if event.epoch > 0:
        grant = verified.grant
        if grant is None:
            return f"epoch not issued: epoch {event.epoch} of {event.session_id} carries no epoch grant"
        if (grant.fleet, grant.session_id, grant.epoch) != (verified.fleet, event.session_id, event.epoch):
            return f"epoch not issued: the epoch grant is not for epoch {event.epoch} of {event.session_id}"
        if event.seq < grant.from_seq:
            return (
                f"epoch not issued: seq {event.seq} is below seq {grant.from_seq}, "
                f"the first granted to epoch {event.epoch}"
            )
    if state.fleet is None:
        state.fleet = verified.fleet
    return None
