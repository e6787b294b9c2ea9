"""Crash tests use the integration fixtures: a pipeline of real processes per test."""

from tests.integration.conftest import new_pipeline  # noqa: F401  (re-exported fixture)
