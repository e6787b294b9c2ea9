"""PII redaction of transcript text before the recorder spools it.

Not :mod:`turnlog.redact`, which hides passwords in URLs in log lines: this
module masks what a user *says* (emails, phone numbers, card numbers, IBANs)
in turn text and tool-call values, before the text reaches the spool, the
events topic or the store.

- :class:`Redactor`: the hook, any callable ``str -> str`` applied to a
  completed turn's text. One that also has ``redact_partial`` (a
  :class:`PartialRedactor`) decides how a partial text is redacted.
- :class:`PatternRedactor`: the built-in one, standard library ``re`` only.
  Each match is replaced by a typed placeholder: ``[EMAIL]``, ``[PHONE]``,
  ``[CARD]``, ``[IBAN]`` (and ``[NUMBER]``, partials only: see below).
- :func:`redactor_from_settings`: ``TURNLOG_REDACTION`` (``off``,
  ``patterns``, ``presidio``) as a redactor; ``None`` for ``off``.
- :func:`partial_redaction`: how the recorder redacts a partial with a
  given redactor.

**Partials agree with the completed turn.** A partial is a prefix of text
still growing: ``"my card is 4111 1111"`` matches nothing yet, and its
completion does. So a partial is redacted by a stricter rule than a completed
text (:meth:`PatternRedactor.redact_partial`):

1. *Hold back the unfinished tail.* Everything from the earliest position
   where the rest of the text could still grow into an entity is left out: a
   trailing word (it may become an email's local part), a trailing run of
   digits and separators (a phone or card number), an IBAN's head. Whatever
   follows, the text before that position is matched the same way in every
   longer text (the patterns only look one character past a match, and a
   match cannot cross that position without starting in the tail), so a
   partial never shows a character that the redaction of a longer text
   masks. ``tests/unit/test_pii.py`` checks this over every prefix of a
   corpus, against every longer prefix.
2. *Mask by shape, without checksums.* Every run of 7 or more digits is masked
   (the completed turn keeps a number that fails its Luhn or phone checks),
   an IBAN's shape without its mod-97 check, and anything with an ``@``
   between address characters (``jane@example``, no domain needed). This
   also covers a partial that is not a prefix of the completed turn (a
   speech recognizer rewrites an interim): each partial is redacted in its
   own right, and an interim that heard a card number with one digit wrong
   is still masked. What such a rewrite can still show is a digit run of at
   most 6 digits (the first six a card may show under PCI DSS 3.4), or an
   address's parts apart (a name, a domain), or text of no entity's shape.

The held-back tail is dropped, not replaced: a partial's text grows as the
turn does, one word (or one number) behind; the completed turn has it all.

Limits: the patterns find digits, not number words (``"four one one one"``),
and ``@``-addresses, not spoken ones (``"john at example dot com"``); a
national phone number needs a trunk ``0``, an area code in parentheses or the
North American 3-3-4 grouping (a bare 10-digit run could be an order number,
so it is not a phone); a 7-digit local number without an area code is not
matched. A random 13 to 19-digit number passes the Luhn check one time in ten
and is masked as ``[CARD]``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from turnlog.settings import TurnlogSettings

__all__ = [
    "Redactor",
    "PartialRedactor",
    "PatternRedactor",
    "Span",
    "merge_spans",
    "render_spans",
    "IBAN_LENGTHS",
    "luhn_valid",
    "iban_valid",
    "partial_redaction",
    "redact_values",
    "redactor_from_settings",
]


@runtime_checkable
class Redactor(Protocol):
    """Masks personal data in one text: ``text -> redacted text``. Applied to every completed
    turn's text and every string in its tool calls before they are spooled. Must be pure
    (the same text gives the same result), must not raise on any ``str``, and must not log
    the text."""

    def __call__(self, text: str) -> str: ...


@runtime_checkable
class PartialRedactor(Redactor, Protocol):
    """A :class:`Redactor` that also redacts partial text (a turn still growing) such that no
    partial shows what the redaction of the completed turn masks (module docstring)."""

    def redact_partial(self, text: str) -> str: ...


@dataclass(frozen=True, slots=True)
class Span:
    """A masked stretch of a text: ``text[start:end]`` is replaced by ``[label]``."""

    start: int
    end: int
    label: str


#: IBAN length (characters, without spaces) per country code: the SWIFT IBAN registry, release 101
#: (as python-stdnum's iban.dat gives it).
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BI": 27,
    "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27, "DK": 18, "DO": 28,
    "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23,
    "GL": 18, "GR": 27, "GT": 28, "HN": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
    "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21,
    "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28,
    "NL": 18, "NO": 15, "OM": 23, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22,
    "RU": 33, "SA": 24, "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25,
    "SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}

# Placeholders, and which wins where two matches overlap (the first listed).
EMAIL, IBAN, CARD, PHONE, NUMBER = "EMAIL", "IBAN", "CARD", "PHONE", "NUMBER"
_PRIORITY = {EMAIL: 0, IBAN: 1, CARD: 2, PHONE: 3, NUMBER: 4}

# Each pattern consumes a bounded run, possessively (no backtracking into it), and looks at most one
# character past it: that is what makes the held-back tail below sufficient. Each *_TAIL pattern accepts
# (at least) every prefix of what its pattern may read from a start position, so a start whose read
# reaches the end of a partial is held back.
_EMAIL_CHARS = r"A-Za-z0-9._%+\-"
_EMAIL = re.compile(
    rf"(?<![{_EMAIL_CHARS}])[{_EMAIL_CHARS}]{{1,64}}+@(?:[A-Za-z0-9\-]{{1,63}}\.){{1,8}}[A-Za-z]{{2,24}}(?![A-Za-z0-9\-])"
)
# A partial masks anything shaped like an address, a domain or not: ``jane@example`` (module docstring).
_EMAIL_SHAPE = re.compile(rf"(?<![{_EMAIL_CHARS}])[{_EMAIL_CHARS}]{{1,64}}+@[A-Za-z0-9.\-]{{0,600}}+")
_EMAIL_TAIL = re.compile(rf"(?<![{_EMAIL_CHARS}])[{_EMAIL_CHARS}]{{1,64}}(?:@[A-Za-z0-9.\-]{{0,600}})?\Z")

# A run of digits and separators: "+44 (0)20 7946 0958", "(555) 123-4567", "4111-1111-1111-1111". Between
# two digits: nothing, a space, dot or dash (then maybe "("), ")" (then maybe a space, dot or dash), or "(".
_SEP = r"(?:[ .\-]\(?|\)[ .\-]?|\()"
_DIGITS_BEFORE = r"(?<![\w+(.\-)])"  # never from inside a word or another run
_MAX_DIGITS = 40
_DIGIT_RUN = re.compile(rf"{_DIGITS_BEFORE}[+(]?\d(?:{_SEP}?\d){{0,{_MAX_DIGITS - 1}}}+(?![\w@])")
_DIGIT_TAIL = re.compile(rf"{_DIGITS_BEFORE}(?:[+(]|[+(]?\d(?:{_SEP}?\d){{0,{_MAX_DIGITS - 1}}}{_SEP}?)\Z")


# An IBAN: a registry country code at a word's start and two digits (_IBAN_HEAD), then that country's
# length of letters and digits, optionally grouped by single spaces (_IBAN_BODY[length], from the digits on).
_IBAN_HEAD = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{2}(?=\d\d)")
_IBAN_BODY = {
    length: re.compile(rf"\d\d(?: ?[A-Za-z0-9]){{0,{length - 4}}}+(?![A-Za-z0-9])")
    for length in set(IBAN_LENGTHS.values())
}
# Any letters-then-digits head with up to 30 more characters (the longest IBAN is 34): looser than the
# registry's lengths, which only holds back more.
_IBAN_TAIL = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{1,2}(?:\d(?:\d(?: ?[A-Za-z0-9]){0,30} ?)?)?\Z")

# How far back each tail can start (characters): email 64 + 1 + 600; a digit run 2 + 39 x 3 + 2; an IBAN
# 2 + 2 + 30 x 2 + 1. And the characters a tail consists of: it starts after the last character not among them.
_EMAIL_TAIL_CHARS, _DIGIT_TAIL_CHARS, _IBAN_TAIL_CHARS = 665, 121, 65
_EMAIL_TAIL_SET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-@"
_DIGIT_TAIL_SET = "0123456789 .-()+"
_PARTIAL_DIGITS = 7  # a partial masks every digit run this long or longer


def luhn_valid(digits: str) -> bool:
    """The Luhn (mod 10) check of a string of ASCII digits, as card numbers carry it (ISO/IEC 7812-1)."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def iban_valid(iban: str) -> bool:
    """The ISO 13616 mod-97 check of an IBAN given without spaces (any case): the country code and
    check digits moved to the end, letters as 10..35, the number mod 97 must be 1."""
    rearranged = (iban[4:] + iban[:4]).upper()
    if not rearranged.isascii() or not rearranged.isalnum():
        return False
    return int("".join(str(int(char, 36)) for char in rearranged)) % 97 == 1


class PatternRedactor:
    """The built-in redactor: emails, phone numbers, card numbers (Luhn) and IBANs (mod 97), with the
    standard library's ``re``; each replaced by ``[EMAIL]``, ``[PHONE]``, ``[CARD]``, ``[IBAN]``.

    ``redactor(text)`` redacts a completed text, :meth:`redact_partial` a partial one (the module
    docstring gives the rule). Stateless and thread-safe; costs a few microseconds per 100 characters.
    What is matched:

    - emails: ``local@domain.tld`` (ASCII; local part up to 64 characters).
    - card numbers: 13 to 19 digits, in groups split by single spaces or dashes, passing the Luhn check.
    - IBANs: a country code of the SWIFT registry, two check digits and that country's length,
      optionally in groups split by single spaces, passing the mod-97 check.
    - phone numbers: ``+`` (or ``00``) and 8 to 15 digits; or a national number of 9 to 12 digits with a
      trunk ``0`` (``020 7946 0958``, ``06 12 34 56 78``), an area code in parentheses (``(555) 123-4567``)
      or the North American grouping ``555-123-4567`` / ``1 555 123 4567``. Not matched: years, times,
      prices, dates (``12.03.2024``, ``2024-03-12``), counts, bare digit runs without a trunk 0.
    """

    def __call__(self, text: str) -> str:
        return render_spans(text, self.spans(text))

    def redact_partial(self, text: str) -> str:
        """Redact ``text``, a partial text that may still grow: mask by shape (every run of 7 or more
        digits, IBANs without their check) and leave out the tail from :meth:`stable_length` on."""
        return render_spans(text, self.spans(text, partial=True), self.stable_length(text))

    def spans(self, text: str, *, partial: bool = False) -> list[Span]:
        """The stretches of ``text`` to mask, in order, overlapping matches merged (the label of the first
        in ``EMAIL, IBAN, CARD, PHONE, NUMBER`` order wins). ``partial``: by shape, without checksums
        (module docstring)."""
        found: list[Span] = []
        if "@" in text:  # every address has one
            for pattern in (_EMAIL, _EMAIL_SHAPE) if partial else (_EMAIL,):
                found.extend(Span(match.start(), match.end(), EMAIL) for match in pattern.finditer(text))
        found.extend(_iban_spans(text, partial))
        for match in _DIGIT_RUN.finditer(text):
            found.extend(_digit_run_spans(match.group(), match.start(), partial))
        return merge_spans(found)

    def stable_length(self, text: str) -> int:
        """Where the held-back tail of a partial ``text`` starts: the earliest position from which the rest
        could still grow into an email, a digit run or an IBAN (``len(text)`` if none). No longer text
        masks a character before it that :meth:`spans` of ``text`` (``partial=True``) leaves."""
        end = len(text)
        stable = end
        for tail, longest, chars in (
            (_EMAIL_TAIL, _EMAIL_TAIL_CHARS, _EMAIL_TAIL_SET),
            (_DIGIT_TAIL, _DIGIT_TAIL_CHARS, _DIGIT_TAIL_SET),
            (_IBAN_TAIL, _IBAN_TAIL_CHARS, None),
        ):
            # The earliest start the tail may have; its look-behind still sees the text before it.
            start = max(0, end - longest, len(text.rstrip(chars)) if chars else 0)
            match = tail.search(text, start)
            if match is not None:
                stable = min(stable, match.start())
        return stable


def _iban_spans(text: str, partial: bool) -> list[Span]:
    """Each IBAN of ``text``: a registry country's code and its length exactly (mod 97 unless ``partial``).
    Scanned left to right as one pattern's ``finditer`` would: after a match, from its end."""
    spans = []
    position = 0
    while (head := _IBAN_HEAD.search(text, position)) is not None:
        start = head.start()
        length = IBAN_LENGTHS.get(head.group().upper())
        body = _IBAN_BODY[length].match(text, start + 2) if length is not None else None
        if body is None:
            position = start + 1
            continue
        compact = text[start:body.end()].replace(" ", "")
        if len(compact) == length and (partial or iban_valid(compact)):
            spans.append(Span(start, body.end(), IBAN))
        position = body.end()
    return spans


def _digit_run_spans(run: str, offset: int, partial: bool) -> list[Span]:
    """What to mask in one run of digits and separators starting at ``offset``: a Luhn-valid card window,
    the whole run if it is a phone number; in a partial, the whole run if it has 7 or more digits."""
    groups = [(m.start(), m.end()) for m in re.finditer(r"\d+", run)]
    digits = sum(end - start for start, end in groups)
    if partial:
        if digits < _PARTIAL_DIGITS:
            return []
        label = CARD if _card_window(run, groups, check=False) else PHONE if _is_phone(run, groups) else NUMBER
        return [Span(offset, offset + len(run), label)]
    spans = []
    window = _card_window(run, groups, check=True)
    if window is not None:
        spans.append(Span(offset + window[0], offset + window[1], CARD))
    if _is_phone(run, groups):
        spans.append(Span(offset, offset + len(run), PHONE))
    return spans


def _card_window(run: str, groups: list[tuple[int, int]], *, check: bool) -> tuple[int, int] | None:
    """The first (then longest) stretch of whole digit groups, joined by single spaces or dashes, holding
    13 to 19 digits (and passing the Luhn check, with ``check``), as ``(start, end)`` in ``run``. The
    group after a leading ``+`` is a country code, never a card's first digits."""
    for first in range(1 if run.startswith("+") else 0, len(groups)):
        best = None
        digits = ""
        for last in range(first, len(groups)):
            if last > first and run[groups[last - 1][1]:groups[last][0]] not in (" ", "-"):
                break
            digits += run[groups[last][0]:groups[last][1]]
            if len(digits) > 19:
                break
            if len(digits) >= 13 and (not check or luhn_valid(digits)):
                best = (groups[first][0], groups[last][1])
        if best is not None:
            return best
    return None


def _is_phone(run: str, groups: list[tuple[int, int]]) -> bool:
    """E.164 allows 15 digits at most; a national number has 9 or more (so no date, 8 digits at most,
    and no local number without its area code)."""
    sizes = tuple(end - start for start, end in groups)
    digits = sum(sizes)
    if run.startswith("+"):
        return 8 <= digits <= 15
    if run.startswith("00") and len(groups) > 1:  # the international call prefix, then the number
        return 8 <= digits - 2 <= 15
    if not 9 <= digits <= 12:
        return False
    if run.startswith("0"):  # a trunk prefix: 020 7946 0958, 06 12 34 56 78, 0171 1234567
        return True
    if "(" in run and ")" in run:  # an area code: (555) 123-4567
        return True
    return sizes in {(3, 3, 4), (1, 3, 3, 4)} and (len(sizes) == 3 or run[0] == "1")


def _priority(label: str) -> int:
    return _PRIORITY.get(label, len(_PRIORITY))


def merge_spans(spans: list[Span]) -> list[Span]:
    """``spans`` in order, overlapping ones merged into one under the label that comes first in
    ``EMAIL, IBAN, CARD, PHONE, NUMBER`` (any other label after those)."""
    merged: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.start, _priority(s.label))):
        if merged and span.start < merged[-1].end:
            last = merged[-1]
            label = min(last.label, span.label, key=_priority)
            merged[-1] = Span(last.start, max(last.end, span.end), label)
        else:
            merged.append(span)
    return merged


def render_spans(text: str, spans: list[Span], stop: int | None = None) -> str:
    """``text[:stop]`` (default: all of it) with each span (in order, not overlapping) replaced by
    ``[label]``; a span that starts before ``stop`` is replaced whole, and ends the text if it reaches
    past ``stop``."""
    if stop is None:
        stop = len(text)
    pieces = []
    position = 0
    for span in spans:
        if span.start >= stop:
            break
        pieces.append(text[position:span.start])
        pieces.append(f"[{span.label}]")
        position = span.end
        if position >= stop:
            return "".join(pieces)
    pieces.append(text[position:stop])
    return "".join(pieces)


_PATTERNS = PatternRedactor()


def partial_redaction(redactor: Redactor) -> Callable[[str], str]:
    """How the recorder redacts a partial text with ``redactor``: its own ``redact_partial`` if it has
    one; otherwise ``redactor`` applied to the partial less its held-back tail
    (:meth:`PatternRedactor.stable_length`). For such a redactor the agreement of partials with the
    completed turn holds for what the built-in patterns find, and otherwise only as far as ``redactor``
    finds in a text cut at a word's end what it finds in the longer text."""
    if isinstance(redactor, PartialRedactor):
        return redactor.redact_partial

    def redact_partial(text: str) -> str:
        return redactor(text[:_PATTERNS.stable_length(text)])

    return redact_partial


def redact_values(value: Any, redactor: Callable[[str], str]) -> Any:
    """``value`` (a tool call's JSON arguments or result) with every string value redacted; keys, numbers,
    booleans and null as they are. Nesting is bounded by the caller (the schema's ``MAX_VALUE_DEPTH``)."""
    if isinstance(value, str):
        return redactor(value)
    if isinstance(value, dict):
        return {key: redact_values(item, redactor) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_values(item, redactor) for item in value]
    return value


def redactor_from_settings(settings: TurnlogSettings) -> Redactor | None:
    """``settings.redaction`` as a redactor: ``off`` -> None, ``patterns`` -> :class:`PatternRedactor`,
    ``presidio`` -> :class:`turnlog.producers.pii_presidio.PresidioRedactor` (offline, pattern
    recognizers; built here, which takes about a second).

    Raises:
        ImportError: ``presidio`` without the extra installed (``pip install 'turnlog[presidio]'``).
    """
    if settings.redaction == "off":
        return None
    if settings.redaction == "patterns":
        return PatternRedactor()
    from turnlog.producers.pii_presidio import PresidioRedactor

    return PresidioRedactor()
