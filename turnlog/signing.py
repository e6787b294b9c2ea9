"""Write-side fleet isolation: record signatures and issued epochs (HMAC-SHA256).

Who may write what (docs/design.md, "Write-side isolation"):

* Each fleet has a signing key (``TURNLOG_FLEET_KEYS``: ``{fleet: key}``, or
  ``{fleet: [current key, older keys...]}`` while a key is rotated: records are
  signed with the first and verified with any). The
  recorder signs every record it spools with its session's fleet key and sets
  two headers: ``turnlog-fleet`` (the fleet's name) and ``turnlog-signature``
  (the HMAC). The sequencer holds every fleet's key and admits a record only
  if the signature verifies, so a process holding fleet A's key can write
  only as fleet A.
* An epoch above 0 must have been issued: a resume claim (``claim_resume``
  through the API or the store) returns an *epoch grant*, a token signed with
  the issuer's key (``TURNLOG_EPOCH_GRANT_KEY``, held by the API, the
  sequencer and single-host resumers) that names the fleet, the session, the
  epoch and the first seq the new owner may write. The recorder sends it in
  the ``turnlog-epoch-grant`` header of every event of that epoch; the
  sequencer refuses an epoch above 0 without a valid grant for exactly that
  fleet, session and epoch, and a seq below the grant's first seq. So no
  record can fence a session or rewrite a stored seq by inventing an epoch.

The signature covers the fleet, the Kafka key (the session id), the value and
the epoch grant, each length-prefixed: no header or byte can be moved from one
record to another. Keys are compared and MACs checked in constant time
(``hmac.compare_digest``). Nothing here logs; errors carry reasons that name
no key and no content.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

__all__ = [
    "FLEET_HEADER",
    "SIGNATURE_HEADER",
    "EPOCH_GRANT_HEADER",
    "MIN_KEY_BYTES",
    "MAX_GRANT_BYTES",
    "EpochGrant",
    "ProvenanceError",
    "RecordSigner",
    "RecordVerifier",
    "VerifiedRecord",
    "KeyRing",
    "issue_epoch_grant",
    "claim_headers",
    "framed",
    "provenance_headers",
    "verify_epoch_grant",
]

FLEET_HEADER: Final = "turnlog-fleet"
SIGNATURE_HEADER: Final = "turnlog-signature"
EPOCH_GRANT_HEADER: Final = "turnlog-epoch-grant"
#: Shortest accepted key, in bytes of its UTF-8 text (an HMAC-SHA256 key of 32 random bytes
#: written as text is 43 characters in base64url: ``secrets.token_urlsafe(32)``).
MIN_KEY_BYTES: Final = 32
#: Longest epoch grant token accepted, in bytes (a real one is about 250); checked before decoding.
MAX_GRANT_BYTES: Final = 1024
#: Longest fleet header accepted, in bytes (the schema's names are at most 200 characters).
MAX_FLEET_BYTES: Final = 800
_SIGNATURE_BYTES: Final = 32
_RECORD_DOMAIN: Final = b"turnlog-record-v1"
_GRANT_DOMAIN: Final = b"turnlog-epoch-grant-v1"


class ProvenanceError(ValueError):
    """A record's or a grant's provenance does not verify; ``reason`` says why (no key, no content)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def framed(*parts: bytes) -> bytes:
    """``parts`` each prefixed by its length (8 bytes, big-endian), so no two tuples frame alike."""
    return b"".join(len(part).to_bytes(8, "big") + part for part in parts)


def _mac(key: bytes, domain: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, framed(domain, *parts), hashlib.sha256).digest()


#: A fleet's keys: one key, or a ring whose first key signs and whose every key verifies (rotation).
KeyRing = str | bytes | Sequence[str | bytes]


def _ring(name: str, keys: KeyRing) -> tuple[bytes, ...]:
    ring = (keys,) if isinstance(keys, (str, bytes)) else tuple(keys)
    if not ring:
        raise ValueError(f"{name} has no key")
    return tuple(_key_bytes(name, key) for key in ring)


def _key_bytes(name: str, key: str | bytes) -> bytes:
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if len(raw) < MIN_KEY_BYTES:
        raise ValueError(f"the key of {name} is {len(raw)} bytes; at least {MIN_KEY_BYTES} are needed")
    return raw


_PROVENANCE_HEADERS: Final = frozenset({"turnlog-fleet", "turnlog-signature", "turnlog-epoch-grant"})


def provenance_headers(
    headers: Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None,
) -> dict[str, bytes]:
    """The provenance headers of a record (in confluent-kafka's, aiokafka's or Faust's shapes), by name.

    Other headers are left out; a header without a value counts as absent.

    Raises:
        ProvenanceError: a provenance header appears more than once (which one counts would be
            ambiguous), or a header name holds a NUL character.
    """
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
    found: dict[str, bytes] = {}
    for name, value in pairs:
        if "\x00" in name:  # clients disagree on such a name (one truncates at the NUL): refuse it
            raise ProvenanceError("a header name holds a NUL character")
        if name not in _PROVENANCE_HEADERS or value is None:
            continue
        if name in found:
            raise ProvenanceError(f"header {name} appears more than once")
        found[name] = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return found


# -- epoch grants ----------------------------------------------------------------------------------
class EpochGrant(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An issued epoch: ``fleet``'s session ``session_id`` may be written at ``epoch`` from seq ``from_seq`` on."""

    fleet: str
    session_id: str
    epoch: int
    from_seq: int


_grant_encoder = msgspec.json.Encoder()
_grant_decoder = msgspec.json.Decoder(EpochGrant)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue_epoch_grant(key: str | bytes, grant: EpochGrant) -> str:
    """The token of ``grant``, signed with the issuer's ``key``: ``<payload>.<mac>`` in base64url (ASCII).

    Raises:
        ValueError: ``key`` is shorter than :data:`MIN_KEY_BYTES`.
    """
    payload = _grant_encoder.encode(grant)
    return f"{_b64(payload)}.{_b64(_mac(_key_bytes('the epoch grant issuer', key), _GRANT_DOMAIN, payload))}"


def verify_epoch_grant(key: bytes, token: bytes | str) -> EpochGrant:
    """The grant ``token`` carries, if ``key`` signed it.

    Raises:
        ProvenanceError: the token is too long, malformed, or not signed with ``key``.
    """
    text = token.decode("ascii", "replace") if isinstance(token, bytes) else token
    if len(text) > MAX_GRANT_BYTES:
        raise ProvenanceError(f"epoch grant is {len(text)} bytes; the limit is {MAX_GRANT_BYTES}")
    payload_text, dot, mac_text = text.partition(".")
    try:
        payload, mac = _unb64(payload_text), _unb64(mac_text)
    except (binascii.Error, ValueError):
        raise ProvenanceError("epoch grant is not base64url") from None
    if not dot or not hmac.compare_digest(mac, _mac(key, _GRANT_DOMAIN, payload)):
        raise ProvenanceError("epoch grant signature does not verify")
    try:
        return _grant_decoder.decode(payload)
    except (msgspec.ValidationError, msgspec.DecodeError):  # signed by us, so never in practice
        raise ProvenanceError("epoch grant payload is malformed") from None


# -- record signatures -----------------------------------------------------------------------------
class RecordSigner:
    """Signs the records of the fleets whose keys it holds (the recorder's side).

    ``keys``: ``{fleet: key or key ring}`` (the ring's first key signs); an
    empty mapping signs nothing (open mode).

    Raises:
        ValueError: a key shorter than :data:`MIN_KEY_BYTES`, or an empty ring.
    """

    def __init__(self, keys: Mapping[str, KeyRing]) -> None:
        self._keys = {fleet: _ring(f"fleet {fleet!r}", ring)[0] for fleet, ring in keys.items()}

    @property
    def enabled(self) -> bool:
        """Whether records are signed at all (some fleet key is configured)."""
        return bool(self._keys)

    def can_sign(self, fleet: str) -> bool:
        """Whether this signer holds ``fleet``'s key."""
        return fleet in self._keys

    def headers(
        self, fleet: str, key: bytes, value: bytes, epoch_grant: str | None = None
    ) -> list[tuple[str, bytes]]:
        """The headers that sign ``value`` (Kafka key ``key``) as ``fleet``'s, with the epoch grant if any.

        Raises:
            KeyError: this signer holds no key for ``fleet``.
        """
        grant = epoch_grant.encode("ascii") if epoch_grant else b""
        fleet_bytes = fleet.encode("utf-8")
        mac = _mac(self._keys[fleet], _RECORD_DOMAIN, fleet_bytes, key, value, grant)
        headers = [(FLEET_HEADER, fleet_bytes), (SIGNATURE_HEADER, mac)]
        if grant:
            headers.append((EPOCH_GRANT_HEADER, grant))
        return headers


def claim_headers(fleet: str, epoch_grant: str | None = None) -> list[tuple[str, bytes]]:
    """Open mode's provenance headers: the fleet the record claims (unsigned) and its epoch grant,
    if any. A sequencer without fleet keys still refuses a record whose claimed fleet is not its
    session's (an honest collision of ids is refused, never merged) and, with a grant key, an
    epoch nobody issued."""
    headers = [(FLEET_HEADER, fleet.encode("utf-8"))]
    if epoch_grant:
        headers.append((EPOCH_GRANT_HEADER, epoch_grant.encode("ascii")))
    return headers


@dataclass(frozen=True, slots=True)
class VerifiedRecord:
    """Who wrote a record that verified: its ``fleet``, and the epoch grant it carried (None: none)."""

    fleet: str
    grant: EpochGrant | None


class RecordVerifier:
    """Checks the provenance of records read from ``<prefix>.events`` (the sequencer's side).

    ``fleet_keys``: ``{fleet: key or key ring}`` (any key of a ring verifies);
    ``grant_key``: the epoch grant issuer's key.

    Raises:
        ValueError: a key shorter than :data:`MIN_KEY_BYTES`, or an empty ring.
    """

    def __init__(self, fleet_keys: Mapping[str, KeyRing], grant_key: str | bytes) -> None:
        self._keys = {fleet.encode("utf-8"): _ring(f"fleet {fleet!r}", ring) for fleet, ring in fleet_keys.items()}
        self._grant_key = _key_bytes("the epoch grant issuer", grant_key)
        #: the fleets whose records verify here
        self.fleets: frozenset[str] = frozenset(fleet_keys)

    def verify(self, headers: Mapping[str, bytes], key: bytes, value: bytes) -> VerifiedRecord:
        """The fleet that signed the record and its verified epoch grant.

        ``headers``: the record's provenance headers by name (:func:`provenance_headers`).

        Raises:
            ProvenanceError: unsigned, an unknown fleet, a signature that does not
                verify, or an epoch grant not issued with the issuer's key.
        """
        fleet = headers.get(FLEET_HEADER)
        signature = headers.get(SIGNATURE_HEADER)
        if fleet is None or signature is None:
            raise ProvenanceError("unsigned: no turnlog-fleet or turnlog-signature header")
        if len(fleet) > MAX_FLEET_BYTES:
            raise ProvenanceError(f"turnlog-fleet header is {len(fleet)} bytes; the limit is {MAX_FLEET_BYTES}")
        ring = self._keys.get(fleet)
        if ring is None:
            raise ProvenanceError("signed by a fleet that has no key here")
        grant_bytes = headers.get(EPOCH_GRANT_HEADER) or b""
        if len(grant_bytes) > MAX_GRANT_BYTES:
            raise ProvenanceError(f"epoch grant is {len(grant_bytes)} bytes; the limit is {MAX_GRANT_BYTES}")
        if len(signature) != _SIGNATURE_BYTES or not any(
            hmac.compare_digest(signature, _mac(fleet_key, _RECORD_DOMAIN, fleet, key, value, grant_bytes))
            for fleet_key in ring
        ):
            raise ProvenanceError("signature does not verify with the fleet's keys")
        grant = verify_epoch_grant(self._grant_key, grant_bytes) if grant_bytes else None
        return VerifiedRecord(fleet.decode("utf-8"), grant)
