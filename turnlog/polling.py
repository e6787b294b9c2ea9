"""Poll a condition until it holds or a deadline passes (never a bare sleep).

:func:`wait_until` calls a probe every ``interval`` seconds until it returns a
truthy value and returns that value; after ``timeout`` seconds it raises
:class:`WaitTimeoutError`, which names what was waited for. The polling is
tenacity's (``retry_if_result``, ``stop_after_delay``, ``wait_fixed``): the probe
runs at once, and once more after the sleep that crosses the deadline, so a
condition that holds by the deadline is seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

from turnlog.exceptions import TurnlogError

__all__ = ["WaitTimeoutError", "wait_until"]

T = TypeVar("T")


class WaitTimeoutError(TurnlogError, TimeoutError):
    """A condition polled by :func:`wait_until` did not hold within its timeout.

    ``what``: the condition, as the caller named it ("node 2 (pid 4242) to exit");
    ``timeout``: the seconds waited.
    """

    def __init__(self, what: str, timeout: float) -> None:
        super().__init__(f"timed out after {timeout:g} s waiting for {what}")
        self.what = what
        self.timeout = timeout


def wait_until(probe: Callable[[], T], *, timeout: float, what: str, interval: float = 0.1) -> T:
    """Call ``probe`` every ``interval`` seconds until it returns a truthy value; return that value.

    ``timeout`` and ``interval`` are in seconds; ``what`` names the condition in the error.

    Raises:
        WaitTimeoutError: ``probe`` returned only falsy values for ``timeout`` seconds.
        Exception: whatever ``probe`` raises, at once (an exception is not retried).
    """

    def timed_out(_: RetryCallState) -> NoReturn:
        raise WaitTimeoutError(what, timeout)

    retrying = Retrying(
        retry=retry_if_result(lambda value: not value),
        stop=stop_after_delay(timeout),
        wait=wait_fixed(interval),
        retry_error_callback=timed_out,
    )
    return retrying(probe)
