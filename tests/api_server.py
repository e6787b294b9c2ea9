"""An ASGI app (the API, or a test's own) served by uvicorn on the loopback, in a thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from tests.support import free_port, wait_until


@contextmanager
def serve(app: Any, *, timeout: float = 30) -> Iterator[str]:
    """``app`` on a real uvicorn server (streams and concurrent requests need one); yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-api-server", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), timeout=timeout, what="the API to serve")
    assert server.started, "the API server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
