"""What a resume grants: the claimed epoch, the stored position and the stored turns.

:class:`ResumeGrant` is the one value every :class:`ResumeSource` gives the
recorder: the API path (``POST /api/sessions/{id}/resume``, read back by
:class:`~turnlog.producers.api_client.ApiResumeSource`) and the direct path
(:class:`~turnlog.resume_barrier.StoreResumeSource`, the barrier over the store
in the same process, for single-host setups). The API and the client share its JSON
shape through :func:`encode_grant` and :func:`decode_grant`, so they cannot
drift apart.

The JSON is msgspec's encoding of the dataclasses: an object per value,
timestamps as RFC 3339 strings in UTC, ``turns`` as an array in
``turn_index`` order. Decoding ignores fields it does not know (a newer
server may add some) and fills ``barged_in`` with False when an older
server leaves it out.

Paging: the API bounds the turns of one answer (``api_page_bytes``, at most
``RESUME_TURN_PAGE`` turns). When more were stored, the grant's
``next_after_turn`` names its last turn, and the client reads the rest from
``GET /api/sessions/{id}/transcript?after_turn=<n>`` (:class:`TurnPage`, the
same turn shape) up to ``max_turn_index``; the grant it returns holds every
turn and ``next_after_turn`` None. An older server leaves the field out
(None: the grant is whole); the direct path never pages.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from turnlog.schemas import SessionStatus, TurnKind

__all__ = ["ResumeSource", "StoredTurn", "ResumeGrant", "TurnPage", "encode_grant", "decode_grant", "decode_turn_page",
           "MAX_RESUME_TIMEOUT_SECONDS", "RESUME_TURN_PAGE"]

#: Longest resume barrier wait the API accepts for one request (seconds). A
#: request holds one of the API's resume workers for up to this long.
MAX_RESUME_TIMEOUT_SECONDS = 600.0
#: Most turns in one page of a resume: the grant's own and each transcript page the client asks for.
RESUME_TURN_PAGE = 1000


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """One turn as the store holds it when the resume is granted.

    ``status`` is ``partial``, ``complete`` or ``interrupted``: a predecessor's
    unfinished turn is still ``partial`` here (the sink marks it interrupted
    once the new epoch's first event is applied). ``barged_in``: the turn was
    cut short by the other speaker (False where the store has no such column).
    Token counts are whole tokens; ``tool_calls`` are the stored
    ``{"name", "arguments", "result"}`` objects, or None. ``attributes``: the turn's
    optional attributes (the event model's ``stored_attributes``), or None.
    """

    turn_index: int
    speaker: str
    text: str
    status: str
    started_at: dt.datetime
    ended_at: dt.datetime | None
    input_tokens: int
    output_tokens: int
    tool_calls: tuple[dict[str, Any], ...] | None
    barged_in: bool = False
    attributes: dict[str, Any] | None = None

    @property
    def kind(self) -> TurnKind:
        """What the turn was (``attributes["kind"]``, schema version 4): ``spoken`` when the
        turn has no kind, or one this release does not know."""
        value = (self.attributes or {}).get("kind")
        return TurnKind(value) if isinstance(value, str) and value in TurnKind._value2member_map_ else TurnKind.SPOKEN

    @property
    def in_context(self) -> bool:
        """False when the framework kept the turn out of the LLM's context (``attributes["out_of_context"]``,
        schema version 4; ``complete_turn(..., in_context=False)``): a rebuilt context leaves it out."""
        return (self.attributes or {}).get("out_of_context") is not True

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StoredTurn:
        """A turn from a ``transcript_turns`` row mapping (``sinks.reads.get_turns``)."""
        tool_calls = row.get("tool_calls")
        return cls(
            turn_index=row["turn_index"],
            speaker=row["speaker"],
            text=row["text"],
            status=row["status"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
            input_tokens=row["input_tokens"],
            output_tokens=row["output_tokens"],
            tool_calls=tuple(tool_calls) if tool_calls is not None else None,
            barged_in=bool(row.get("barged_in") or False),
            attributes=row.get("attributes"),
        )


@dataclass(frozen=True, slots=True)
class ResumeGrant:
    """A claimed resume of a session, read in the same transaction as the claim.

    ``epoch`` is the epoch the new owner writes in (higher than every epoch
    applied or claimed before, so it fences the predecessor). ``status`` is the
    session's status in the store; only ``active`` sessions are resumable (for
    the others nothing was claimed). ``last_seq`` is the highest contiguous
    stored seq (-1: none), ``max_turn_index`` the highest stored turn (None:
    no turn), and ``turns`` the stored turns in ``turn_index`` order.
    ``fleet`` and ``epoch_grant``: see docs/design.md, "Write-side isolation".
    """

    session_id: str
    epoch: int
    status: str
    last_seq: int
    max_turn_index: int | None
    turns: tuple[StoredTurn, ...] = ()
    #: the session's fleet (None from a server that does not say)
    fleet: str | None = None
    #: the signed epoch grant the new owner sends with every event of ``epoch``
    #: (``turnlog/signing.py``); None where no epoch grant key is configured
    epoch_grant: str | None = None
    #: paging: the last turn index in ``turns`` when more stored turns follow it
    #: (see the module docstring); None: ``turns`` holds every stored turn
    next_after_turn: int | None = None

    @property
    def resumable(self) -> bool:
        """Whether the session is active, so this grant may be used to continue it."""
        return self.status == SessionStatus.ACTIVE

    @property
    def next_seq(self) -> int:
        """The first seq the new owner sends."""
        return self.last_seq + 1

    @property
    def next_turn_index(self) -> int:
        """The first turn index after every stored turn."""
        return 0 if self.max_turn_index is None else self.max_turn_index + 1


@dataclass(frozen=True, slots=True)
class TurnPage:
    """A page of stored turns, as ``GET /api/sessions/{id}/transcript`` answers it
    (its other fields, the session's row, are ignored here). ``next_after_turn``:
    the last turn index given when more follow; None on the last page."""

    turns: tuple[StoredTurn, ...] = ()
    next_after_turn: int | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ResumeGrant)
_page_decoder = msgspec.json.Decoder(TurnPage)


def encode_grant(grant: ResumeGrant) -> bytes:
    """``grant`` as UTF-8 JSON (the body of the API's resume response)."""
    return _encoder.encode(grant)


def decode_grant(data: bytes | str) -> ResumeGrant:
    """The grant encoded in ``data``.

    Raises:
        msgspec.DecodeError: ``data`` is not JSON, or does not have the grant's
            shape (``msgspec.ValidationError`` is a subclass).
    """
    return _decoder.decode(data)


def decode_turn_page(data: bytes | str) -> TurnPage:
    """The turns of a transcript page in ``data``.

    Raises:
        msgspec.DecodeError: ``data`` is not JSON, or its turns do not have the
            stored turn's shape.
    """
    return _page_decoder.decode(data)


class ResumeSource(Protocol):
    """Where :meth:`SessionRecorder.resume` gets its grant: the resume barrier, run by
    whoever holds the store (docs/design.md, "Events").

    The recorder holds one for its lifetime and calls :meth:`close` from its own ``close()``:
    give each recorder a source of its own (a closed source reopens what it needs at its next
    grant, but one closed while another recorder's grant runs fails that grant).
    Implementations: :class:`~turnlog.producers.api_client.ApiResumeSource` (turnlog's API; the
    recorder's default when ``TURNLOG_API_URL`` is set) and
    :class:`~turnlog.resume_barrier.StoreResumeSource` (the store, in this process).
    """

    async def grant(self, session_id: str, timeout: float) -> ResumeGrant | None:
        """Pass the barrier for ``session_id`` within ``timeout`` seconds, claim its next epoch
        and return the grant (None: no such session within the caller's fleets).

        Raises:
            ResumeBarrierTimeout: the pipeline or the store did not catch up in time.
            SessionErasedError: the session is being forgotten; nothing is claimed.
            RecorderError: any other refusal (see the implementation).
        """
        ...

    def close(self) -> None:
        """Release what the source holds (clients, connections); a later grant may reopen them."""
        ...
