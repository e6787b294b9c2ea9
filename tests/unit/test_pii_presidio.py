"""PresidioRedactor (the extra turnlog[presidio]) runs offline: Presidio's pattern recognizers on its
NoOpNlpEngine, with every network connection refused. Skipped where presidio-analyzer is not installed
(it is not in the test install: it pulls in spaCy); run it in a venv with `pip install -e '.[test,presidio]'`."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("presidio_analyzer", reason="the optional extra turnlog[presidio] is not installed")

from turnlog.producers.pii import PartialRedactor, PatternRedactor, redactor_from_settings  # noqa: E402
from turnlog.producers.pii_presidio import PresidioRedactor, offline_analyzer  # noqa: E402
from turnlog.settings import TurnlogSettings  # noqa: E402

EMAIL, CARD, PHONE, IBAN = "jane.doe@example.org", "4111 1111 1111 1111", "+44 20 7946 0958", "GB82 WEST 1234 5698 7654 32"


@pytest.fixture(scope="module")
def offline():
    """Every socket connection refused while the module's redactor is built and used."""
    original = socket.socket.connect

    def refuse(self, *args, **kwargs):
        raise OSError("no network in this test")

    socket.socket.connect = refuse
    try:
        yield PresidioRedactor()
    finally:
        socket.socket.connect = original


def test_it_masks_the_pattern_types_and_what_only_presidio_knows_with_no_network(offline):
    text = f"mail {EMAIL}, card {CARD}, call {PHONE}, iban {IBAN}, ssn 536-90-4399, phone 212-555-0143, ip 192.168.1.20"
    assert offline(text) == "mail [EMAIL], card [CARD], call [PHONE], iban [IBAN], ssn [US_SSN], phone [PHONE], ip [IP_ADDRESS]"
    assert PatternRedactor()("phone 212-555-0143") == "phone [PHONE]"
    assert PatternRedactor()("ip 192.168.1.20") == "ip 192.168.1.20"  # Presidio's finding, not the patterns'


def test_ordinary_text_is_kept(offline):
    text = "I was born in 1990, we met at 10:30 and it cost 12.50, order 123456789, 3 kids"
    assert offline(text) == text


def test_partials_hold_back_their_tail_and_show_nothing_the_completed_turn_masks(offline):
    assert isinstance(offline, PartialRedactor)
    said = f"my card is {CARD} and my mail is {EMAIL}, call {PHONE} or 212-555-0143, ssn 536-90-4399 thanks"
    completed = offline(said)
    secrets = [CARD, CARD.replace(" ", ""), EMAIL, PHONE, "212-555-0143", "536-90-4399"]
    for end in range(len(said) + 1):
        partial = offline.redact_partial(said[:end])
        assert not [s for s in secrets if s in partial], (said[:end], partial)
        # Presidio may label a stretch differently in a prefix; where the partial masks nothing it is a
        # prefix of the completed turn's redaction.
        if "[" not in partial:
            assert completed.startswith(partial), (partial, completed)
    assert offline.redact_partial("my card is 4111 1111") == "my card is "


def test_the_setting_builds_it_and_a_custom_analyzer_plugs_in():
    assert isinstance(redactor_from_settings(TurnlogSettings(redaction="presidio")), PresidioRedactor)
    analyzer = offline_analyzer("en")
    only_ips = PresidioRedactor(analyzer, entities=["IP_ADDRESS"])
    assert only_ips("ip 192.168.1.20, ssn 536-90-4399") == "ip [IP_ADDRESS], ssn 536-90-4399"
