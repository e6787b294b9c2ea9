"""Signed erasure ledger records (turnlog/crypto/ledger_signatures.py): only a record an issuer
signed, for exactly its key and value, tells a reader to forget a session."""

from __future__ import annotations

import datetime as dt

import pytest

from turnlog.crypto.ledger_signatures import (
    ISSUER_HEADER,
    SIGNATURE_HEADER,
    LedgerSigner,
    LedgerVerifier,
    UnauthenticatedErasure,
    issuer_public_key,
    ledger_signer,
    new_issuer_key,
)
from turnlog.exceptions import ConfigurationError
from turnlog.schemas import EventValidationError
from turnlog.schemas.erasure import Erasure, encode_erasure
from turnlog.settings import TurnlogSettings

PRIVATE, PUBLIC = new_issuer_key()
SIGNER = LedgerSigner("ops", PRIVATE)
VERIFIER = LedgerVerifier({"ops": PUBLIC})


def record(requested_by: str = "ops:cli:alice", session_id: str = "s-1", fleet: str = "a") -> tuple[bytes, bytes]:
    erasure = Erasure(session_id=session_id, fleet=fleet, requested_by=requested_by,
                      requested_at=dt.datetime(2026, 12, 7, tzinfo=dt.UTC))
    return f"{fleet}\x00{session_id}".encode(), encode_erasure(erasure)


def refused(key: bytes | None, value: bytes, headers) -> str:
    """The reason ``VERIFIER`` refuses the record for; the DLQ's class is ``unauthenticated``."""
    with pytest.raises(UnauthenticatedErasure) as e:
        VERIFIER.read(key, value, headers)
    assert e.value.reason_class == "unauthenticated"
    return e.value.reason


def test_a_signed_record_reads_back_with_its_issuer():
    key, value = record()
    verified = VERIFIER.read(key, value, SIGNER.headers(key, value))
    assert verified.issuer == "ops" and verified.erasure.session_id == "s-1" and verified.erasure.fleet == "a"
    assert issuer_public_key(PRIVATE) == PUBLIC


def test_a_signature_covers_the_key_the_value_and_the_issuer():
    key, value = record()
    headers = SIGNER.headers(key, value)
    other_key, other_value = record(session_id="s-2")
    assert "does not verify" in refused(other_key, value, headers)  # moved to another key
    assert "does not verify" in refused(key, other_value, headers)  # moved to another value
    assert "does not verify" in refused(key, value.replace(b'"a"', b'"b"'), headers)  # another fleet
    renamed = [(ISSUER_HEADER, b"ops2"), headers[1]]
    assert "unknown issuer" in refused(key, value, renamed)


def test_unsigned_foreign_and_malformed_records_are_refused_naming_no_key():
    key, value = record()
    intruder = LedgerSigner("ops", new_issuer_key()[0])
    reasons = [
        refused(key, value, None),
        refused(key, value, [(ISSUER_HEADER, b"ops")]),
        refused(key, value, intruder.headers(key, value)),
        refused(key, value, [*SIGNER.headers(key, value), (SIGNATURE_HEADER, b"x" * 64)]),
        refused(key, value, [(ISSUER_HEADER, b"ops"), (SIGNATURE_HEADER, b"short")]),
    ]
    assert all(PRIVATE not in reason and PUBLIC not in reason for reason in reasons)


def test_requested_by_must_name_the_verified_issuer():
    key, value = record(requested_by="cli:mallory")
    assert "requested_by" in refused(key, value, SIGNER.headers(key, value))
    assert SIGNER.requested_by("cli:alice") == "ops:cli:alice"
    assert SIGNER.requested_by("ops:retention") == "ops:retention"


def test_a_record_that_is_no_erasure_is_invalid_not_unauthenticated():
    with pytest.raises(EventValidationError) as e:
        VERIFIER.read(b"k", b"{}", None)
    assert e.value.reason_class == "invalid"


def test_open_mode_takes_an_unsigned_record():
    key, value = record(requested_by="cli:alice")
    open_mode = LedgerVerifier({})
    assert not open_mode.enabled and open_mode.read(key, value, None).issuer is None


def test_bad_keys_and_names_are_configuration_errors():
    with pytest.raises(ConfigurationError, match="32 bytes"):
        LedgerVerifier({"ops": "c2hvcnQ"})
    with pytest.raises(ConfigurationError, match="base64url"):
        LedgerSigner("ops", "not base64 !!")
    with pytest.raises(ConfigurationError, match="name"):
        LedgerSigner("a:b", PRIVATE)
    assert ledger_signer(TurnlogSettings()) is None
    assert ledger_signer(TurnlogSettings(erasure_issuer="ops", erasure_issuer_key=PRIVATE)).name == "ops"


def test_a_host_whose_erasures_its_readers_would_refuse_fails_at_once():
    other_private, _ = new_issuer_key()
    trusted = {"ops": PUBLIC}
    with pytest.raises(ConfigurationError, match="no TURNLOG_ERASURE_ISSUER_KEY"):
        ledger_signer(TurnlogSettings(erasure_issuers=trusted))
    with pytest.raises(ConfigurationError, match="not the one"):
        ledger_signer(TurnlogSettings(erasure_issuer="ops", erasure_issuer_key=other_private, erasure_issuers=trusted))
    with pytest.raises(ConfigurationError, match="not the one"):
        ledger_signer(TurnlogSettings(erasure_issuer="api", erasure_issuer_key=PRIVATE, erasure_issuers=trusted))
    assert ledger_signer(TurnlogSettings(erasure_issuer="ops", erasure_issuer_key=PRIVATE,
                                         erasure_issuers=trusted)).public == SIGNER.public
