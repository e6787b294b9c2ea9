"""Adapter tests drive each framework with its own fakes against the real broker and Postgres."""

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

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
