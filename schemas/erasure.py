"""The erasure ledger's record: ``<prefix>.erasures`` (compacted, key = session id).

One record per forgotten session, never tombstoned: it is what every reader
(the sink, replay, verify, the live hub, each recorder's drainer) checks before
it stores, rebuilds or delivers anything of the session (docs/design.md,
"Encryption and erasure"). It names the session, its fleet, who asked, when
and why; it never holds content.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Final, Literal

import msgspec

from turnlog.schemas.events import Name, SessionId, UtcTime
from turnlog.schemas.exceptions import EventValidationError

__all__ = ["Erasure", "ErasureReason", "encode_erasure", "decode_erasure", "MAX_ERASURE_BYTES"]

#: Why a session was forgotten: someone asked (``request``), or the retention policy (``retention``).
ErasureReason = Literal["request", "retention"]
#: Largest erasure record read, in bytes (a real one is ~300).
MAX_ERASURE_BYTES: Final = 4096


class Erasure(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A session to forget everywhere.

    ``fleet``: the session's fleet (the scope the request was checked against);
    ``requested_by``: who asked (``cli:<user>``, ``api:<token id>``, ``retention``),
    never a secret; ``requested_at``: when (UTC).
    """

    session_id: SessionId
    fleet: Annotated[Name, msgspec.Meta(description="The session's fleet.")]
    requested_by: Name
    requested_at: UtcTime
    reason: ErasureReason = "request"


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Erasure)


def encode_erasure(erasure: Erasure) -> bytes:
    """The record's value: compact JSON."""
    return _encoder.encode(erasure)


def decode_erasure(data: bytes | None) -> Erasure:
    """Parse one ledger record's value.

    Raises:
        EventValidationError: no value, over ``MAX_ERASURE_BYTES``, or not an erasure record.
    """
    if data is None:
        raise EventValidationError("the erasure record has no value")
    if len(data) > MAX_ERASURE_BYTES:
        raise EventValidationError(f"the erasure record is over {MAX_ERASURE_BYTES} bytes")
    try:
        erasure = _decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise EventValidationError(f"erasure record: {e}") from e
    if erasure.session_id.endswith("\n"):
        raise EventValidationError("erasure record: session_id ends with a newline")
    return erasure


def now() -> dt.datetime:
    """The current time as the ledger writes it (UTC)."""
    return dt.datetime.now(dt.UTC)
