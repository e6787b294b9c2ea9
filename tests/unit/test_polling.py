"""turnlog.polling.wait_until: the probe's value, the typed timeout, probe errors; and the tests' wrapper."""

from __future__ import annotations

import itertools
import time

import pytest

from turnlog.exceptions import TurnlogError
from turnlog.polling import WaitTimeoutError, wait_until

from tests import support


def test_returns_the_first_truthy_value():
    values = iter([None, 0, "", [], {"ready": True}, "later"])
    calls = itertools.count(1)

    def probe():
        next(calls)
        return next(values)

    assert wait_until(probe, timeout=5, what="a value", interval=0.01) == {"ready": True}
    assert next(calls) == 6  # five calls, none after the truthy one


def test_a_timeout_raises_a_typed_timeout_naming_what_was_awaited():
    calls = itertools.count(1)
    began = time.monotonic()
    with pytest.raises(WaitTimeoutError) as raised:
        wait_until(lambda: next(calls) and False, timeout=0.3, what="node 2 (pid 42) to exit", interval=0.05)
    assert time.monotonic() - began >= 0.3
    assert next(calls) > 3  # it polled, not waited once
    error = raised.value
    assert isinstance(error, TimeoutError) and isinstance(error, TurnlogError)
    assert (error.what, error.timeout) == ("node 2 (pid 42) to exit", 0.3)
    assert str(error) == "timed out after 0.3 s waiting for node 2 (pid 42) to exit"


def test_the_probe_runs_once_more_after_the_sleep_that_crosses_the_deadline():
    deadline = time.monotonic() + 0.2
    assert wait_until(lambda: time.monotonic() >= deadline, timeout=0.2, what="the deadline", interval=0.15)


def test_a_probe_error_is_raised_at_once_not_retried():
    calls = itertools.count(1)

    def probe():
        next(calls)
        raise ConnectionRefusedError("no broker")

    with pytest.raises(ConnectionRefusedError, match="no broker"):
        wait_until(probe, timeout=5, what="the broker", interval=0.01)
    assert next(calls) == 2


def test_the_tests_wait_until_fails_the_test_with_an_assertion_error():
    assert support.wait_until(lambda: 7, timeout=1, what="seven") == 7
    with pytest.raises(AssertionError, match="timed out after 0.1 s waiting for the sink to store") as raised:
        support.wait_until(lambda: False, timeout=0.1, what="the sink to store", interval=0.02)
    assert not isinstance(raised.value, TimeoutError)  # no `except TimeoutError` of the code under test takes it
    assert isinstance(raised.value.__cause__, WaitTimeoutError)
