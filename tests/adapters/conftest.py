"""Adapter tests drive each framework with its own fakes against the real broker and Postgres."""

from tests.integration.conftest import new_pipeline, pipeline  # noqa: F401  (re-exported fixtures)
