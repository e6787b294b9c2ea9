"""Record signatures and epoch grants (turnlog/signing.py) and the sequencer's admission rules
(stream_processors/admission.py), without a broker."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from turnlog.exceptions import ConfigurationError
from turnlog.schemas import SessionStarted, TurnPartial, encode_event
from turnlog.settings import TurnlogSettings
from turnlog.signing import (
    EPOCH_GRANT_HEADER,
    FLEET_HEADER,
    SIGNATURE_HEADER,
    EpochGrant,
    ProvenanceError,
    RecordSigner,
    RecordVerifier,
    claim_headers,
    issue_epoch_grant,
    provenance_headers,
    verify_epoch_grant,
)
from turnlog.stream_processors.admission import admit, admit_open, authenticate, note_owner, record_verifier
from turnlog.stream_processors.sequencing import SessionSequence

KEY_A, KEY_B, ISSUER = "a" * 40, "b" * 40, "i" * 40
NOW = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)


def _started(session_id: str, fleet: str) -> SessionStarted:
    return SessionStarted(
        event_id=uuid.uuid4(), session_id=session_id, seq=0, epoch=0, producer_id="p", emitted_at=NOW,
        fleet=fleet, agent_id="agent", started_at=NOW,
    )


def _partial(session_id: str, seq: int, epoch: int = 0) -> TurnPartial:
    return TurnPartial(
        event_id=uuid.uuid4(), session_id=session_id, seq=seq, epoch=epoch, producer_id="p", emitted_at=NOW,
        turn_index=0, speaker="user", text="hello", started_at=NOW,
    )


@pytest.fixture
def verifier() -> RecordVerifier:
    return RecordVerifier({"a": KEY_A, "b": KEY_B}, ISSUER)


def _signed(fleet: str, key: str, event, grant: str | None = None) -> tuple[bytes, bytes, dict[str, bytes]]:
    raw = encode_event(event)
    record_key = event.session_id.encode()
    headers = RecordSigner({fleet: key}).headers(fleet, record_key, raw, grant)
    return record_key, raw, provenance_headers(headers)


def test_a_signed_record_verifies_as_its_fleet(verifier):
    record_key, raw, headers = _signed("a", KEY_A, _started("s1", "a"))
    verified = verifier.verify(headers, record_key, raw)
    assert verified.fleet == "a" and verified.grant is None


@pytest.mark.parametrize("tamper", ["value", "key", "fleet", "signature", "grant"])
def test_any_change_to_a_signed_record_fails_verification(verifier, tamper):
    grant = issue_epoch_grant(ISSUER, EpochGrant(fleet="a", session_id="s1", epoch=1, from_seq=3))
    record_key, raw, headers = _signed("a", KEY_A, _partial("s1", 3, epoch=1), grant)
    if tamper == "value":
        raw = raw.replace(b"hello", b"HELLO")
    elif tamper == "key":
        record_key = b"s2"
    elif tamper == "fleet":
        headers[FLEET_HEADER] = b"b"
    elif tamper == "signature":
        headers[SIGNATURE_HEADER] = bytes(32)
    else:
        headers[EPOCH_GRANT_HEADER] = issue_epoch_grant(ISSUER, EpochGrant("a", "s1", 9, 0)).encode()
    with pytest.raises(ProvenanceError):
        verifier.verify(headers, record_key, raw)


def test_a_record_signed_with_a_key_the_sequencer_does_not_hold_is_refused(verifier):
    record_key, raw, headers = _signed("c", "c" * 40, _started("s1", "c"))
    with pytest.raises(ProvenanceError, match="no key"):
        verifier.verify(headers, record_key, raw)


def test_an_unsigned_record_and_a_repeated_header_are_refused(verifier):
    raw = encode_event(_started("s1", "a"))
    with pytest.raises(ProvenanceError, match="unsigned"):
        verifier.verify({}, b"s1", raw)
    with pytest.raises(ProvenanceError, match="more than once"):
        provenance_headers([(FLEET_HEADER, b"a"), (FLEET_HEADER, b"b")])
    assert provenance_headers([("other", b"x"), (FLEET_HEADER, None)]) == {}


def test_an_epoch_grant_round_trips_and_refuses_forgery_and_oversize():
    grant = EpochGrant(fleet="a", session_id="s1", epoch=2, from_seq=10)
    token = issue_epoch_grant(ISSUER, grant)
    assert verify_epoch_grant(ISSUER.encode(), token) == grant
    with pytest.raises(ProvenanceError, match="does not verify"):
        verify_epoch_grant(ISSUER.encode(), issue_epoch_grant("x" * 40, grant))
    with pytest.raises(ProvenanceError):
        verify_epoch_grant(ISSUER.encode(), "not-base64!.@@")
    with pytest.raises(ProvenanceError, match="limit"):
        verify_epoch_grant(ISSUER.encode(), "a" * 2000)


def test_short_keys_are_refused():
    with pytest.raises(ValueError, match="at least 32"):
        RecordSigner({"a": "short"})
    with pytest.raises(ValueError, match="at least 32"):
        RecordVerifier({"a": KEY_A}, "short")


def _admit(verifier, state, fleet, key, event, grant=None):
    record_key, raw, headers = _signed(fleet, key, event, grant)
    return admit(authenticate(verifier, record_key, raw, headers), state, event, fleets=verifier.fleets)


def test_a_key_in_a_fleets_namespace_is_started_by_that_fleet_only(verifier):
    # fleet b cannot take fleet a's session key, so a's agent never loses its id
    reason = _admit(verifier, refused_state := SessionSequence(), "b", KEY_B, _started("a:call-1", "b"))
    assert reason is not None and reason.startswith("foreign fleet")
    assert refused_state.fleet is None
    owned = SessionSequence()
    assert _admit(verifier, owned, "a", KEY_A, _started("a:call-1", "a")) is None and owned.fleet == "a"
    # b's own key for the same id is another session
    assert _admit(verifier, SessionSequence(), "b", KEY_B, _started("b:call-1", "b")) is None
    # a bare id (a recorder from before per-fleet keys), or one whose prefix names no fleet here, goes to its first writer
    assert _admit(verifier, SessionSequence(), "b", KEY_B, _started("call-1", "b")) is None
    assert _admit(verifier, SessionSequence(), "b", KEY_B, _started("sip:call-1", "b")) is None


def test_a_later_seq_of_a_key_may_come_first_from_its_fleet_only(verifier):
    """A range the consumer skipped (read again by the gap repair) or a replay from a time: the
    session's start comes after later seqs. The key names its owner, so they are admitted."""
    state = SessionSequence()
    assert _admit(verifier, state, "a", KEY_A, _partial("a:call-1", 3)) is None and state.fleet == "a"
    reason = _admit(verifier, SessionSequence(), "b", KEY_B, _partial("a:call-1", 3))
    assert reason is not None and reason.startswith("foreign fleet")
    # a bare id still waits for its start
    reason = _admit(verifier, SessionSequence(), "a", KEY_A, _partial("call-1", 3))
    assert reason is not None and reason.startswith("no owner")


def test_the_admitted_start_makes_its_signer_the_owner_and_another_fleet_is_refused(verifier):
    state = SessionSequence()
    assert _admit(verifier, state, "a", KEY_A, _started("s1", "a")) is None
    assert state.fleet == "a"
    state.next_seq, state.started_event_id = 1, "started"  # as sequence() leaves it
    # fleet b reuses the id: refused, never merged, and the owner stays a
    assert _admit(verifier, state, "b", KEY_B, _started("s1", "b")).startswith("foreign fleet")
    assert _admit(verifier, state, "b", KEY_B, _partial("s1", 1)).startswith("foreign fleet")
    assert _admit(verifier, state, "a", KEY_A, _partial("s1", 1)) is None
    assert state.fleet == "a"


def test_no_record_but_the_start_can_open_a_session(verifier):
    """A later seq arriving first (a squatter guessing the id, or a buggy producer) opens nothing."""
    state = SessionSequence()
    reason = _admit(verifier, state, "b", KEY_B, _partial("s1", 50))
    assert reason.startswith("no owner") and state.fleet is None
    grant = issue_epoch_grant(ISSUER, EpochGrant("b", "s1", 1, 0))
    assert _admit(verifier, state, "b", KEY_B, _partial("s1", 0, epoch=1), grant).startswith("no owner")
    assert _admit(verifier, state, "a", KEY_A, _started("s1", "a")) is None and state.fleet == "a"


def test_a_session_from_before_the_keys_is_taken_over_only_through_a_granted_resume(verifier):
    legacy = SessionSequence(next_seq=7, started_event_id="started")  # sequenced in open mode, before note_owner
    assert _admit(verifier, legacy, "b", KEY_B, _partial("s1", 7)).startswith("no owner")
    assert legacy.fleet is None
    grant = issue_epoch_grant(ISSUER, EpochGrant("a", "s1", 1, 7))
    assert _admit(verifier, legacy, "a", KEY_A, _partial("s1", 7, epoch=1), grant) is None
    assert legacy.fleet == "a"


def test_open_mode_keeps_the_owner_of_an_applied_start():
    state = SessionSequence()
    event = _started("s1", "a")
    note_owner(state, event)
    assert state.fleet is None  # not applied yet
    state.started_event_id = str(event.event_id)
    note_owner(state, event)
    assert state.fleet == "a"


def test_without_fleet_keys_the_sequencer_refuses_to_start_unless_told_to_run_open():
    with pytest.raises(ConfigurationError, match="TURNLOG_INSECURE_OPEN_FLEETS"):
        record_verifier(TurnlogSettings())
    assert record_verifier(TurnlogSettings(insecure_open_fleets=True)) is None


def _claims(fleet: str, grant: str | None = None) -> dict[str, bytes]:
    return provenance_headers(claim_headers(fleet, grant))


def test_open_mode_refuses_a_record_claiming_another_fleet_than_its_session_s_owner():
    state = SessionSequence()
    assert admit_open(_claims("b"), None, state, _started("s1", "a")).startswith("forged fleet")
    state.fleet = "a"  # fleet a's session.started was applied (note_owner)
    assert admit_open(_claims("b"), None, state, _started("s1", "b")).startswith("foreign fleet")
    assert admit_open(_claims("b"), None, state, _partial("s1", 3)).startswith("foreign fleet")
    assert admit_open(_claims("a"), None, state, _partial("s1", 3)) is None
    assert admit_open({}, None, state, _partial("s1", 3)) is None  # a writer that claims nothing (older release)


def test_open_mode_with_a_grant_key_admits_only_an_issued_epoch():
    state = SessionSequence(fleet="a", next_seq=5)
    event = _partial("s1", 5, epoch=1)
    key = ISSUER.encode()
    grant = issue_epoch_grant(ISSUER, EpochGrant("a", "s1", 1, 5))
    assert admit_open(_claims("a"), key, state, event).startswith("epoch not issued")
    assert admit_open(_claims("a", issue_epoch_grant("j" * 40, EpochGrant("a", "s1", 1, 5))), key, state,
                      event).startswith("epoch not issued")
    assert admit_open(_claims("a", grant), key, state, _partial("s1", 5, epoch=2**31 - 1)).startswith("epoch not")
    assert admit_open(_claims("a", issue_epoch_grant(ISSUER, EpochGrant("b", "s1", 1, 5))), key, state,
                      event).startswith("epoch not issued")
    assert "below seq 5" in admit_open(_claims("a", grant), key, state, _partial("s1", 2, epoch=1))
    assert admit_open(_claims("a", grant), key, state, event) is None
    assert admit_open(_claims("a"), None, state, event) is None  # no grant key: epochs are not checked
    assert admit_open({}, key, state, event) is None  # a recorder of an older release claims nothing: not checked


def test_a_session_started_naming_another_fleet_than_its_signer_is_refused(verifier):
    state = SessionSequence()
    assert _admit(verifier, state, "b", KEY_B, _started("s1", "a")).startswith("forged fleet")
    assert state.fleet is None


def test_an_epoch_is_admitted_only_with_its_grant_and_never_below_the_granted_seq(verifier):
    state = SessionSequence(fleet="a", next_seq=5)
    event = _partial("s1", 5, epoch=1)
    assert _admit(verifier, state, "a", KEY_A, event).startswith("epoch not issued")
    invented = _partial("s1", 5, epoch=2**31 - 1)
    grant = issue_epoch_grant(ISSUER, EpochGrant("a", "s1", 1, 5))
    assert _admit(verifier, state, "a", KEY_A, invented, grant).startswith("epoch not issued")
    other_fleet_grant = issue_epoch_grant(ISSUER, EpochGrant("b", "s1", 1, 5))
    assert _admit(verifier, state, "a", KEY_A, event, other_fleet_grant).startswith("epoch not issued")
    assert "below seq 5" in _admit(verifier, state, "a", KEY_A, _partial("s1", 2, epoch=1), grant)
    assert _admit(verifier, state, "a", KEY_A, event, grant) is None


def test_a_rotated_key_ring_signs_with_its_first_key_and_verifies_with_any(verifier):
    new, old = "n" * 40, KEY_A
    rotated = RecordVerifier({"a": [new, old]}, ISSUER)
    for signing_key in (new, old):
        record_key, raw, headers = _signed("a", signing_key, _started("s1", "a"))
        assert rotated.verify(headers, record_key, raw).fleet == "a"
    record_key, raw, headers = _signed("a", new, _started("s1", "a"))
    with pytest.raises(ProvenanceError):
        verifier.verify(headers, record_key, raw)  # a verifier without the new key
    assert RecordSigner({"a": [new, old]}).headers("a", record_key, raw) == RecordSigner({"a": new}).headers(
        "a", record_key, raw
    )


def test_a_header_name_with_a_nul_is_refused():
    with pytest.raises(ProvenanceError, match="NUL"):
        provenance_headers([("turnlog-fleet\x00zz", b"a")])


def _decode(raw: bytes):
    from turnlog.schemas import decode_event

    return decode_event(raw)


def test_the_signing_bench_measures_both_modes_doing_the_same_work():
    from turnlog.tools.bench.signing import signing_cost

    from tests.support import EventFactory as Factory

    payloads = []
    for n in range(5):
        f = Factory(f"bench-{n}")
        payloads += [(f.session_id, encode_event(e)) for e in (f.started(), f.completed(1, 0, "hi"), f.ended(2, last_turn=0))]
    cost = signing_cost(payloads, rounds=1, batch=4)
    assert cost["events"] == 15
    assert cost["recorder_sign_us"] > 0 and cost["sequencer_on_us"] > 0 and cost["sequencer_off_us"] > 0



@pytest.mark.parametrize(
    ("value", "said"),
    [
        ('{a:1}', "a JSON value is expected"),
        ('{"a": "short"}', "shorter than 32 bytes"),
        ('{"*": "' + "k" * 40 + '"}', "invalid fleet"),
        ('{"a": "' + "k" * 40 + '", "b": "' + "k" * 40 + '"}', "every key must be distinct"),
    ],
)
def test_a_bad_fleet_key_setting_is_one_clear_line_that_shows_no_key(value, said, tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "TURNLOG_FLEET_KEYS": value, "TURNLOG_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"}
    done = subprocess.run([sys.executable, "-m", "turnlog.cli", "migrate"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert said in done.stderr and "Traceback" not in done.stderr and "k" * 40 not in done.stderr
