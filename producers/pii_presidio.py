"""Presidio as the recorder's redactor (the optional extra ``turnlog[presidio]``), offline.

:class:`PresidioRedactor` runs turnlog's :class:`~turnlog.producers.pii.PatternRedactor` first, then
Microsoft Presidio's analyzer on what is left, and replaces each of Presidio's findings by
``[ENTITY_TYPE]`` (``[PHONE]``, ``[CARD]``, ``[IBAN]``, ``[EMAIL]`` for the types the patterns share).

Offline: by default the analyzer runs Presidio's pattern recognizers only, on its ``NoOpNlpEngine``
(presidio-analyzer 2.2.364 and later), which loads no spaCy model; spaCy's models are downloaded from
GitHub, not PyPI, so none is needed or fetched. Name-like entities (``PERSON``, ``LOCATION``) need a
model: pass your own ``AnalyzerEngine`` built with one you installed. Presidio's email recognizer is
left out of the defaults (the patterns mask emails first): it checks domains with ``tldextract``,
which fetches the public suffix list over the network on first use (it falls back to its bundled copy).

Partials: :meth:`PresidioRedactor.redact_partial` applies the patterns' partial rule (the held-back
tail, masking by shape; ``turnlog.producers.pii``) and then Presidio to what is left. The agreement of
partials with the completed turn is proven for the pattern types; for Presidio's own findings it holds
as far as Presidio finds in a text cut before its unfinished tail what it finds in the longer text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from turnlog.producers.pii import PatternRedactor, Span, merge_spans, render_spans

__all__ = ["PresidioRedactor", "DEFAULT_ENTITIES", "offline_analyzer"]

#: Presidio's entity types PresidioRedactor looks for by default: those its pattern recognizers find
#: without an NLP model, less the noisy ones (DATE_TIME, URL) and EMAIL_ADDRESS (see the module docstring).
DEFAULT_ENTITIES: tuple[str, ...] = (
    "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE", "US_SSN", "US_ITIN", "UK_NHS", "IP_ADDRESS", "CRYPTO",
)
_LABELS = {"EMAIL_ADDRESS": "EMAIL", "PHONE_NUMBER": "PHONE", "CREDIT_CARD": "CARD", "IBAN_CODE": "IBAN"}


def offline_analyzer(language: str = "en") -> Any:
    """A Presidio ``AnalyzerEngine`` with the predefined pattern recognizers of ``language`` on the
    ``NoOpNlpEngine``: no model is loaded or downloaded.

    Raises:
        ImportError: presidio-analyzer (2.2.364 or later) is not installed: ``pip install 'turnlog[presidio]'``.
    """
    try:
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer.nlp_engine import NoOpNlpEngine
    except ImportError as e:
        raise ImportError(
            f"PresidioRedactor needs presidio-analyzer 2.2.364 or later ({e}): pip install 'turnlog[presidio]'"
        ) from e
    nlp_engine = NoOpNlpEngine(models=[{"lang_code": language, "model_name": "none"}])
    registry = RecognizerRegistry(supported_languages=[language])
    registry.load_predefined_recognizers(languages=[language], nlp_engine=nlp_engine)
    return AnalyzerEngine(registry=registry, nlp_engine=nlp_engine, supported_languages=[language])


class PresidioRedactor:
    """turnlog's patterns, then Presidio's analyzer (a :class:`~turnlog.producers.pii.PartialRedactor`).

    ``analyzer``: a ``presidio_analyzer.AnalyzerEngine`` (default: :func:`offline_analyzer`);
    ``entities``: the Presidio entity types to mask; ``score_threshold``: Presidio's score (0 to 1) a
    finding needs (0.4 keeps its phone numbers, which it scores 0.4). Building the default analyzer
    takes about a second; redacting a 100-character text a few milliseconds.

    Raises:
        ImportError: presidio-analyzer is not installed (see :func:`offline_analyzer`).
    """

    def __init__(
        self,
        analyzer: Any | None = None,
        *,
        entities: Iterable[str] = DEFAULT_ENTITIES,
        language: str = "en",
        score_threshold: float = 0.4,
    ) -> None:
        self._analyzer = analyzer if analyzer is not None else offline_analyzer(language)
        self._entities = list(entities)
        self._language = language
        self._score_threshold = score_threshold
        self._patterns = PatternRedactor()

    def __call__(self, text: str) -> str:
        return self._presidio(self._patterns(text))

    def redact_partial(self, text: str) -> str:
        return self._presidio(self._patterns.redact_partial(text))

    def _presidio(self, text: str) -> str:
        if not text:
            return text
        results = self._analyzer.analyze(
            text=text, language=self._language, entities=self._entities, score_threshold=self._score_threshold
        )
        spans = [Span(r.start, r.end, _LABELS.get(r.entity_type, r.entity_type)) for r in results]
        return render_spans(text, merge_spans(spans))
