"""The adapter tests' guard (``tests.support.require_extra``): a missing framework skips
its tests on a core install, and fails them where the extras are meant to be installed."""

from __future__ import annotations

import pytest

from tests.support import REQUIRE_EXTRAS_ENV, require_extra


def test_a_missing_framework_skips_its_tests_on_a_core_install(monkeypatch):
    monkeypatch.delenv(REQUIRE_EXTRAS_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"turnlog\[nowhere\]"):
        require_extra("turnlog_no_such_framework", "nowhere")


def test_a_missing_framework_is_an_error_where_the_extras_are_required(monkeypatch):
    monkeypatch.setenv(REQUIRE_EXTRAS_ENV, "1")
    with pytest.raises(ImportError, match=r"pip install -e '\.\[nowhere\]'"):
        require_extra("turnlog_no_such_framework", "nowhere")


def test_an_installed_framework_neither_skips_nor_fails(monkeypatch):
    monkeypatch.setenv(REQUIRE_EXTRAS_ENV, "1")
    require_extra("json", "none")  # returns: the module imports
