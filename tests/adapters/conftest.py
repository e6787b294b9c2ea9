"""Adapter tests drive each framework with its own fakes against the real broker and Postgres."""

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.integration.conftest import new_pipeline, pipeline  # noqa: F401  (re-exported fixtures)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def import_example(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Imports ``examples/<file name>`` as a module with no ``OPENAI_API_KEY`` set:
    an example must import without network or API keys."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    def load(file_name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"example_{Path(file_name).stem}", EXAMPLES / file_name)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


class RecorderSpans:
    """The spans the recorders of this test made, kept in memory (an OpenTelemetry SDK
    ``InMemorySpanExporter`` behind turnlog's own :class:`~turnlog.tracing.Tracing`)."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter

    def turns(self, session_id: str) -> dict[int, dict[str, Any]]:
        """The attributes of each ``complete_turn`` span of ``session_id``, by turn index
        (the last span of an index: a turn is completed once)."""
        return {
            span.attributes["turnlog.turn_index"]: dict(span.attributes)
            for span in self.exporter.get_finished_spans()
            if span.name == "complete_turn" and span.attributes.get("turnlog.session_id") == session_id
        }


@pytest.fixture
def recorder_spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecorderSpans]:
    """Tracing on, every span sampled, for the recorders started in this process from now on:
    a recorder takes its tracer from ``service_tracing`` at ``start()``, which gives it one
    exporting to memory (``RecorderSpans``) instead of OTLP."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import turnlog.producers.recorder as recorder_module
    from turnlog.tracing import Tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # exported as each span ends
    monkeypatch.setattr(recorder_module, "service_tracing", lambda settings, component: Tracing(provider, component))
    yield RecorderSpans(exporter)
    provider.shutdown()
