"""The redaction of transcript text before it is spooled (producers/pii.py): the built-in patterns,
the agreement of partials with the completed turn over every prefix, and the recorder's hook."""

from __future__ import annotations

import asyncio
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnlog.producers import RecorderError, SessionRecorder
from turnlog.producers.drainer import Ticket
from turnlog.producers.pii import (
    IBAN_LENGTHS,
    PartialRedactor,
    PatternRedactor,
    iban_valid,
    luhn_valid,
    partial_redaction,
    redact_values,
    redactor_from_settings,
)
from turnlog.producers.recorder import RecordedSession
from turnlog.schemas import TurnCompleted, TurnPartial, decode_event, encode_event
from turnlog.settings import TurnlogSettings
from turnlog.tools.bench.redaction import redaction_cost

from tests.support import EventFactory

REDACT = PatternRedactor()

EMAILS = ["john.smith@example.com", "a.b-c+tag@mail.example.co.uk", "x@y.io"]
PHONES = [
    "+44 20 7946 0958", "+1 (555) 123-4567", "+33 6 12 34 56 78", "+4915112345678", "0044 20 7946 0958",
    "(555) 123-4567", "555-123-4567", "555.123.4567", "1 555 123 4567", "020 7946 0958", "06 12 34 56 78",
    "0171 1234567", "+44 (0)20 7946 0958",
]
CARDS = ["4111 1111 1111 1111", "4111-1111-1111-1111", "4111111111111111", "5500 0000 0000 0004", "3782 822463 10005"]
IBANS = ["GB82 WEST 1234 5698 7654 32", "DE89 3704 0044 0532 0130 00", "DE89370400440532013000", "FR14 2004 1010 0505 0001 3M02 606", "NO9386011117947"]


@pytest.mark.parametrize(("value", "label"), [*((e, "EMAIL") for e in EMAILS), *((p, "PHONE") for p in PHONES), *((c, "CARD") for c in CARDS), *((i, "IBAN") for i in IBANS)])
def test_each_entity_is_replaced_by_its_typed_placeholder(value, label):
    assert REDACT(f"it is {value}, thanks") == f"it is [{label}], thanks"
    assert REDACT(value) == f"[{label}]"
    assert REDACT(f"({value})") == f"([{label}])" or label == "PHONE"  # a phone may open with its own "("


@pytest.mark.parametrize(
    "text",
    [
        "I was born in 1990 and moved in 2004.",
        "the meeting is at 10:30, or 14:45 at the latest",
        "it costs $1,299.99 or 12.50 EUR, about 3 kids and 12 dogs",
        "order number 123456789 and invoice 2024-0042",
        "on 12.03.2024 or 2024-03-12 or 03/12/2024",
        "4111 1111 1111 1112 fails the Luhn check",
        "1234 5678 9012 3456 is a made-up number",
        "DE89 3704 0044 0532 0130 02 fails mod 97",
        "GB82 WEST 1234 5698 7654 3 is one character short",
        "version 3.11.7 of python, port 9092, pid 12345",
        "meet me @ noon at example.com",
        "a 20-digit run 12345678901234567890 is no card",
        "score 3 - 1, room 101, flight BA 2490",
    ],
)
def test_ordinary_numbers_and_near_misses_are_kept(text):
    assert REDACT(text) == text


def test_the_checks_are_the_standard_ones():
    assert luhn_valid("4111111111111111") and luhn_valid("378282246310005") and not luhn_valid("4111111111111112")
    assert iban_valid("GB82WEST12345698765432") and iban_valid("gb82west12345698765432")
    assert not iban_valid("GB83WEST12345698765432") and not iban_valid("GB82WEST1234569876543!")
    assert IBAN_LENGTHS["DE"] == 22 and IBAN_LENGTHS["FR"] == 27 and len(IBAN_LENGTHS) == 89


def test_overlapping_matches_merge_under_the_stronger_label():
    # The digits of an IBAN may pass the Luhn check too; the IBAN wins.
    text = "pay DE89 3704 0044 0532 0130 00 now"
    assert REDACT(text) == "pay [IBAN] now"
    assert [s.label for s in REDACT.spans("call +1 4111 1111 1111 1111")] == ["CARD"]


def test_a_partial_holds_back_what_could_still_grow_and_masks_long_digit_runs_by_shape():
    assert REDACT.redact_partial("my card is 4111 1111") == "my card is "
    assert REDACT.redact_partial("write to bob@exa") == "write to "
    assert REDACT.redact_partial("Hello there.") == "Hello "
    assert REDACT.redact_partial("Hello there. ") == "Hello there. "
    assert REDACT.redact_partial("card 4111 1111 1111 1112, ok ") == "card [CARD], ok "  # no Luhn check in a partial
    assert REDACT.redact_partial("ref 1234567 ok ") == "ref [NUMBER] ok "
    assert REDACT.redact_partial("room 101 ok ") == "room 101 ok "
    assert REDACT.redact_partial("mail jane@example, ok ") == "mail [EMAIL], ok "  # no domain needed in a partial
    assert REDACT("mail jane@example, ok ") == "mail jane@example, ok "
    assert REDACT("card 4111 1111 1111 1112, ok ") == "card 4111 1111 1111 1112, ok "


# -- partials agree with the completed turn ---------------------------------------------------------

CORPUS = [
    "my card is 4111 1111 1111 1111 and it expires 12/27",
    "card 4111-1111-1111-1111, then 5500 0000 0000 0004.",
    "the number 4111 1111 1111 1112 fails but 4111111111111111 passes",
    "amex 3782 822463 10005 ok",
    "email me at john.smith@example.com or a.b-c+tag@mail.example.co.uk please",
    "x@y.io",
    "reach me on +44 20 7946 0958 or +1 (555) 123-4567 tomorrow",
    "call 555-123-4567, 555.123.4567 or (555) 123-4567 at 10:30",
    "in France 06 12 34 56 78, in Germany 0171 1234567, +44 (0)20 7946 0958",
    "iban GB82 WEST 1234 5698 7654 32 and DE89370400440532013000 and FR14 2004 1010 0505 0001 3M02 606",
    "NO93 8601 1117 947 then 1990 and 2024-03-12 and $12.50",
    "order 123456789, born 1990, 3 kids, room 101, v3.11.7",
    "a run 12345678901234567890 then 4111 1111 1111 1111 2024",
    "mixed: bob@example.com4111 1111 1111 1111 +44 20 7946 0958x",
    "(555) 123-4567(555) 123-4567 and +1-555-123-4567.",
    "Gb82west12345698765432 lower case, de89 3704 0044 0532 0130 00 too",
    "edge +4 + 44 ( 555 ) - 0 00 0044 0 1 2 3 4 5 6 7 8 9 10 11 12",
    "nearly iban GB82 WEST 1234 5698 7654 3 and then words",
    "+44 20 7946 0958@a.b-c+tag@mail.example.co.uk and jane@example, no domain",
]


def _bits(spans) -> int:
    mask = 0
    for span in spans:
        mask |= ((1 << (span.end - span.start)) - 1) << span.start
    return mask


def _revealed(text: str) -> int:
    """Positions of ``text`` a partial shows: before the held-back tail and outside every partial span."""
    stable = REDACT.stable_length(text)
    return ((1 << stable) - 1) & ~_bits(REDACT.spans(text, partial=True))


def _expected_partial(text: str) -> str:
    """The partial's text built from the spans and the stable length (the rendering, independently)."""
    stable = REDACT.stable_length(text)
    out, position = [], 0
    for span in REDACT.spans(text, partial=True):
        if span.start >= stable:
            break
        out += [text[position:span.start], f"[{span.label}]"]
        position = span.end
    if position < stable:
        out.append(text[position:stable])
    return "".join(out)


def _unlabelled(redacted: str) -> str:
    return re.sub(r"\[(?:EMAIL|PHONE|CARD|IBAN|NUMBER)\]", "[]", redacted)


def check_every_prefix(text: str, *, all_pairs: bool) -> None:
    """For each prefix P of ``text``: the partial shows no position that the completed redaction (or the
    partial one) of a longer prefix masks; the partial of P is a prefix of every longer prefix's partial;
    and it is rendered from P's spans and stable length. ``all_pairs``: against every longer prefix, not
    only the whole text."""
    prefixes = [text[:n] for n in range(len(text) + 1)]
    revealed = [_revealed(p) for p in prefixes]
    masked_final = [_bits(REDACT.spans(p)) for p in prefixes]
    masked_partial = [_bits(REDACT.spans(p, partial=True)) for p in prefixes]
    partials = [REDACT.redact_partial(p) for p in prefixes]
    for n, prefix in enumerate(prefixes):
        assert partials[n] == _expected_partial(prefix), prefix
        for m in range(n, len(prefixes)) if all_pairs else (len(prefixes) - 1,):
            leaked = revealed[n] & (masked_final[m] | masked_partial[m])
            assert not leaked, (
                f"the partial {partials[n]!r} of {prefix!r} shows position {leaked.bit_length() - 1}, masked in {prefixes[m]!r}"
            )
            # A span reaching into the held-back tail may merge with a longer text's match there (a phone's
            # last digits become an email's local part): the placeholder's label may change, not its place.
            assert _unlabelled(partials[m]).startswith(_unlabelled(partials[n])), (prefix, prefixes[m])
        # The completed text's redaction starts with the partial's revealed text wherever the partial masks nothing.
        assert REDACT(text).startswith(partials[n]) or REDACT.spans(prefix, partial=True), (prefix, text)


@pytest.mark.parametrize("text", CORPUS)
def test_no_partial_shows_what_a_longer_text_masks(text):
    check_every_prefix(text, all_pairs=True)


_FRAGMENTS = st.sampled_from(
    [*EMAILS, *PHONES, *CARDS, *IBANS, "4111 1111 1111 1112", "1990", "10:30", "12.50", "2024-03-12", "hello", "card",
     "at", "+", "(", ")", "-", ".", "@", "0", "00", "44", "1234", "GB82", "west"]
)
_GLUE = st.sampled_from(["", " ", "  ", ", ", ". ", "-", "(", ")", "+", "@", "x"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_FRAGMENTS, _GLUE), min_size=1, max_size=6))
def test_no_partial_shows_what_the_completed_text_masks_over_generated_texts(parts):
    check_every_prefix("".join(fragment + glue for fragment, glue in parts), all_pairs=False)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789 .-()+@abxGBDE", max_size=40))
def test_no_partial_shows_what_a_longer_text_masks_over_texts_of_the_patterns_characters(text):
    check_every_prefix(text, all_pairs=True)


def test_the_held_back_tail_is_bounded_and_the_rule_costs_little_on_long_texts():
    text = "word " * 20_000 + "4111 1111"
    assert REDACT.stable_length(text) == len(text) - len("4111 1111")
    assert REDACT.redact_partial("x" * 64) == ""  # could still be an email's local part
    assert REDACT.redact_partial("x" * 65) == "x" * 65  # too long for one (64 characters at most)
    assert REDACT("x" * 65 + "@y.io") == "x" * 65 + "@y.io"


# -- other redactors, tool values, settings -------------------------------------------------------


def test_a_plain_callable_gets_the_held_back_tail_rule_for_partials():
    def upper(text: str) -> str:
        return text.upper()

    assert not isinstance(upper, PartialRedactor) and isinstance(REDACT, PartialRedactor)
    assert partial_redaction(upper)("call me at 555") == "CALL ME AT "
    assert partial_redaction(REDACT)("my card is 4111 1111") == "my card is "


def test_tool_values_are_redacted_string_by_string_and_keys_are_kept():
    value = {"email": "x@y.io", "n": 3, "ok": True, "none": None, "list": ["4111 1111 1111 1111", {"x@y.io": "fine"}]}
    assert redact_values(value, REDACT) == {
        "email": "[EMAIL]", "n": 3, "ok": True, "none": None, "list": ["[CARD]", {"x@y.io": "fine"}]
    }


def test_the_setting_names_the_redactor():
    assert redactor_from_settings(TurnlogSettings()) is None  # off by default
    assert isinstance(redactor_from_settings(TurnlogSettings(redaction="patterns")), PatternRedactor)


async def test_the_recorder_makes_its_redactor_from_the_setting_at_start_unless_given_one(tmp_path):
    settings = TurnlogSettings(
        redaction="patterns", spool_dir=str(tmp_path / "spool"), bootstrap_servers="127.0.0.1:1", spool_close_timeout_seconds=1
    )
    recorder = SessionRecorder(settings)
    assert recorder.redactor is None  # nothing is built in the constructor
    async with recorder:
        assert isinstance(recorder.redactor, PatternRedactor)

    def mine(text: str) -> str:
        return text

    given = SessionRecorder(settings.model_copy(update={"spool_dir": str(tmp_path / "given")}), redactor=mine)
    async with given:
        assert given.redactor is mine
    off = SessionRecorder(settings.model_copy(update={"redaction": "off", "spool_dir": str(tmp_path / "off")}))
    async with off:
        assert off.redactor is None


# -- the recorder's hook --------------------------------------------------------------------------


class SpoolingRecorder:
    """Stands in for SessionRecorder around a real RecordedSession: keeps what would be spooled, acknowledges
    it at once, and redacts with SessionRecorder's own methods."""

    _redacted = SessionRecorder._redacted
    _redacted_call = SessionRecorder._redacted_call

    def __init__(self, redactor):
        self.settings = TurnlogSettings()
        self.producer_id = "unit"
        self.redactor = redactor
        self._redact_partial = partial_redaction(redactor) if redactor is not None else None
        self.sent = []

    def _turn_span(self, *_args, **_kwargs):
        return None  # tracing off

    def _spool(self, session, payload, trace=None):
        self.sent.append(decode_event(payload))
        ticket = Ticket()
        ticket.spooled.set_result(None)
        ticket.acked.set_result(None)
        return ticket

    async def _await_durable(self, ticket, span=None):
        await asyncio.wrap_future(ticket.spooled)

    def _forget(self, session):
        pass


def _session(redactor) -> RecordedSession:
    return RecordedSession(SpoolingRecorder(redactor), "s-1", fleet="f", epoch=0, next_seq=1, next_turn_index=0)


async def test_the_recorder_redacts_partials_at_flush_and_the_completed_turn_and_its_tool_values():
    session = _session(PatternRedactor())
    session.update_partial(0, "user", "my card is 4111 1111")
    session.update_partial(0, "user", "my card is 4111 1111 1111 1111")  # only the newest text is redacted, once
    await session.flush_partial()
    session.update_partial(0, "user", "my card is 4111 1111 1111 1111 ok, and mail x@")
    await session.flush_partial()
    session.update_partial(0, "user", "my card is 4111 1111 1111 1111 ok, and mail x@y")  # the same when redacted
    await session.flush_partial()
    await session.complete_turn(
        0, "user", "my card is 4111 1111 1111 1111 ok, and mail x@y.io",
        tool_calls=[{"name": "crm", "arguments": {"email": "x@y.io"}, "result": ["call +44 20 7946 0958"]}],
    )
    sent = session._recorder.sent
    assert [type(e) for e in sent] == [TurnPartial, TurnPartial, TurnCompleted]
    assert [e.text for e in sent] == ["my card is ", "my card is [CARD] ok, and mail ", "my card is [CARD] ok, and mail [EMAIL]"]
    assert [e.seq for e in sent] == [1, 2, 3]
    assert (sent[2].tool_calls[0].arguments, sent[2].tool_calls[0].result) == ({"email": "[EMAIL]"}, ["call [PHONE]"])


async def test_without_a_redactor_the_text_is_spooled_as_given():
    session = _session(None)
    session.update_partial(0, "user", "x@y.io")
    await session.flush_partial()
    await session.complete_turn(0, "user", "x@y.io 4111 1111 1111 1111")
    assert [e.text for e in session._recorder.sent] == ["x@y.io", "x@y.io 4111 1111 1111 1111"]


async def test_a_failing_redactor_fails_the_call_naming_the_turn_not_the_text():
    def broken(text: str) -> str:
        raise ValueError(f"cannot redact {text}")

    session = _session(broken)
    with pytest.raises(RecorderError, match="the redactor raised ValueError on turn 0") as caught:
        await session.complete_turn(0, "user", "secret x@y.io")
    assert "secret" not in str(caught.value) and caught.value.__cause__ is None
    session.update_partial(1, "user", "secret words ")
    with pytest.raises(RecorderError, match="on turn 1"):
        await session.flush_partial()
    assert session._recorder.sent == []


def test_the_bench_measures_the_redaction_cost_per_event_of_each_kind():
    f = EventFactory("bench-1")
    events = [f.started(), f.partial(1, 0, "my card is"), f.partial(2, 0, "my card is 4111"), f.completed(3, 0, "my card is 4111 1111 1111 1111"), f.ended(4, last_turn=0)]
    cost = redaction_cost([(f.session_id, encode_event(e)) for e in events], rounds=1)
    assert (cost["events"], cost["completed_turns"], cost["partials"]) == (5, 1, 2)
    assert cost["completed_us"] > 0 and cost["partial_us"] > 0 and cost["per_event_us"] > 0
    assert cost["completed_mean_chars"] == len("my card is 4111 1111 1111 1111")
