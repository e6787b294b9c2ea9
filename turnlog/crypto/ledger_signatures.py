"""Signed erasure ledger records: who may tell every reader to forget a session.

docs/design.md, "Encryption and erasure". A record of ``<prefix>.erasures`` makes every
reader (the sink, the analytics projection, each recorder's drainer, the live hub, replay,
verify) drop a session. Anyone who can write the topic could erase any session, so each
record is signed by an *issuer*: a named Ed25519 key (RFC 8032) that only the hosts that
issue erasures hold (the CLI's ``turnlog forget``, the API, the sink's retention sweep and
its publication of pending erasures). Readers hold the issuers' public keys only, so an
agent host, which reads the ledger to drop what its spool holds, cannot forge one.

The signature covers a domain tag, the issuer's name, the record's key and its value, so a
signature cannot be moved to another record, another key or another issuer. It travels in
two headers (the value's JSON stays the schema's): ``turnlog-erasure-issuer`` (the name) and
``turnlog-erasure-signature`` (64 bytes). The record's ``requested_by`` must begin with
``<issuer>:``, so the audit row names the verified issuer, never what a writer chose.

Keys are 32 random bytes, base64url (``python -c 'import secrets;
print(secrets.token_urlsafe(32))'`` makes a private one; ``turnlog keys erasure-issuer``
prints a new pair). Without any issuer key configured (``TURNLOG_ERASURE_ISSUERS`` empty),
readers take unsigned records, as before signatures existed (open mode).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from turnlog.exceptions import ConfigurationError
from turnlog.schemas import EventValidationError
from turnlog.schemas.erasure import Erasure, decode_erasure
from turnlog.settings import TurnlogSettings

__all__ = [
    "UnauthenticatedErasure",
    "ISSUER_HEADER",
    "SIGNATURE_HEADER",
    "LedgerSigner",
    "LedgerVerifier",
    "VerifiedErasure",
    "issuer_public_key",
    "ledger_signer",
    "ledger_verifier",
    "new_issuer_key",
]

class UnauthenticatedErasure(EventValidationError):
    """A ledger record no trusted erasure issuer signed (the DLQ's class ``unauthenticated``); its
    reason names no key."""

    reason_class = "unauthenticated"


ISSUER_HEADER = "turnlog-erasure-issuer"
SIGNATURE_HEADER = "turnlog-erasure-signature"
_DOMAIN = b"turnlog erasure ledger v1\x00"
_SIGNATURE_BYTES = 64
_MAX_ISSUER_BYTES = 64  # leaves room in requested_by (200 characters) for "<issuer>:<who>"


def _key_bytes(text: str, what: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text.strip() + "=" * (-len(text.strip()) % 4))
    except (binascii.Error, ValueError) as e:
        raise ConfigurationError(f"{what} is not base64url") from e
    if len(raw) != 32:
        raise ConfigurationError(f"{what} must be 32 bytes (base64url), not {len(raw)}")
    return raw


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def new_issuer_key() -> tuple[str, str]:
    """A new issuer key pair: ``(private, public)``, each 32 bytes base64url."""
    private = _b64(Ed25519PrivateKey.generate().private_bytes_raw())
    return private, issuer_public_key(private)


def issuer_public_key(private: str) -> str:
    """The public key (base64url) of the private issuer key ``private`` (base64url).

    Raises:
        ConfigurationError: ``private`` is not 32 bytes of base64url.
    """
    key = Ed25519PrivateKey.from_private_bytes(_key_bytes(private, "the erasure issuer key"))
    return _b64(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def _message(issuer: bytes, key: bytes, value: bytes) -> bytes:
    return b"".join((_DOMAIN, len(issuer).to_bytes(2, "big"), issuer, len(key).to_bytes(4, "big"), key, value))


class LedgerSigner:
    """Signs the ledger records of one issuer (``name``, its private key in base64url)."""

    def __init__(self, name: str, private_key: str) -> None:
        if not name or len(name.encode("utf-8")) > _MAX_ISSUER_BYTES or ":" in name:
            raise ConfigurationError("the erasure issuer's name must be 1 to 64 bytes without ':'")
        self.name = name
        self._key = Ed25519PrivateKey.from_private_bytes(_key_bytes(private_key, "the erasure issuer key"))
        #: the raw public key (32 bytes) readers verify this issuer's records with
        self.public = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def requested_by(self, who: str) -> str:
        """``who`` (``cli:<user>``, ``api:<token id>``, ``retention``) as the issuer signs it:
        ``<issuer>:<who>``."""
        return who if who.startswith(f"{self.name}:") else f"{self.name}:{who}"

    def headers(self, key: bytes, value: bytes) -> list[tuple[str, bytes]]:
        """The record's signature headers, for its ``key`` and ``value`` exactly as produced."""
        issuer = self.name.encode("utf-8")
        return [(ISSUER_HEADER, issuer), (SIGNATURE_HEADER, self._key.sign(_message(issuer, key, value)))]


@dataclass(frozen=True, slots=True)
class VerifiedErasure:
    """A ledger record that passed :meth:`LedgerVerifier.read`; ``issuer`` is None in open mode."""

    erasure: Erasure
    issuer: str | None


class LedgerVerifier:
    """Checks ledger records against the issuers' public keys (``{name: base64url}``); with none,
    open mode: every well-formed record is taken, signed or not."""

    def __init__(self, issuers: Mapping[str, str]) -> None:
        self._keys = {
            name: Ed25519PublicKey.from_public_bytes(_key_bytes(key, f"the public key of erasure issuer {name!r}"))
            for name, key in issuers.items()
        }

    @property
    def enabled(self) -> bool:
        """True when records must be signed by a known issuer."""
        return bool(self._keys)

    def read(self, key: bytes | None, value: bytes | None, headers: Any) -> VerifiedErasure:
        """Verify and decode one ledger record (``headers`` as the Kafka client gives them).

        Raises:
            EventValidationError: not an erasure record.
            UnauthenticatedErasure: (issuers configured) unsigned, signed
                by an unknown issuer, a signature that does not verify, a repeated header, or a
                ``requested_by`` that does not begin with ``<issuer>:``. Reasons name no key.
        """
        erasure = decode_erasure(value)
        if not self._keys:
            return VerifiedErasure(erasure, None)
        found = _signature_headers(headers)
        if found is None:
            raise UnauthenticatedErasure("the erasure record is not signed by an erasure issuer")
        issuer_bytes, signature = found
        issuer = issuer_bytes.decode("utf-8", "replace")
        public = self._keys.get(issuer)
        if public is None:
            raise UnauthenticatedErasure("the erasure record is signed by an unknown issuer")
        try:
            public.verify(signature, _message(issuer_bytes, key or b"", value or b""))
        except InvalidSignature:
            raise UnauthenticatedErasure("the erasure record's signature does not verify") from None
        if not erasure.requested_by.startswith(f"{issuer}:"):
            raise UnauthenticatedErasure("the erasure record's requested_by does not name its issuer")
        return VerifiedErasure(erasure, issuer)


def _signature_headers(headers: Any) -> tuple[bytes, bytes] | None:
    """``(issuer, signature)`` from the record's headers, or None if either is missing.

    Raises:
        UnauthenticatedErasure: a header repeated, or a signature of the wrong length.
    """
    pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers or ())
    values: dict[str, bytes] = {}
    for name, value in pairs:
        if name in (ISSUER_HEADER, SIGNATURE_HEADER):
            if name in values:
                raise UnauthenticatedErasure(f"the erasure record's header {name} is repeated")
            values[name] = bytes(value or b"")
    if ISSUER_HEADER not in values or SIGNATURE_HEADER not in values:
        return None
    if len(values[SIGNATURE_HEADER]) != _SIGNATURE_BYTES or len(values[ISSUER_HEADER]) > _MAX_ISSUER_BYTES:
        raise UnauthenticatedErasure("the erasure record's signature headers are malformed")
    return values[ISSUER_HEADER], values[SIGNATURE_HEADER]


def ledger_signer(settings: TurnlogSettings) -> LedgerSigner | None:
    """The signer of the ledger records this host writes (``erasure_issuer``, ``erasure_issuer_key``),
    or None in open mode (no issuer key and no ``erasure_issuers``: records go out unsigned).

    Raises:
        ConfigurationError: the key or the name is malformed; or ``erasure_issuers`` is set and
            this host holds no issuer key, or one whose public half is not trusted under its name
            (every record it wrote would be refused by every reader, its own included, and the
            erasure would stay pending).
    """
    if settings.erasure_issuer_key is None:
        if settings.erasure_issuers:
            raise ConfigurationError(
                "TURNLOG_ERASURE_ISSUERS is set but this host holds no TURNLOG_ERASURE_ISSUER_KEY: every erasure "
                "it wrote would be refused by the ledger's readers (docs/security.md, 'Erasure issuers')"
            )
        return None
    signer = LedgerSigner(settings.erasure_issuer, settings.erasure_issuer_key.get_secret_value())
    trusted = settings.erasure_issuers.get(signer.name)
    if settings.erasure_issuers and (trusted is None or _key_bytes(trusted, "a trusted issuer key") != signer.public):
        raise ConfigurationError(
            f"the erasure issuer key of {signer.name!r} is not the one TURNLOG_ERASURE_ISSUERS trusts under that "
            "name: every erasure this host wrote would be refused by the ledger's readers"
        )
    return signer


def ledger_verifier(settings: TurnlogSettings) -> LedgerVerifier:
    """The readers' check of ledger records (``erasure_issuers``; empty: open mode).

    Raises:
        ConfigurationError: a public key is malformed.
    """
    return LedgerVerifier(settings.erasure_issuers)
