"""Security headers on every response of the HTTP API (an ASGI middleware).

Every response: ``X-Content-Type-Options: nosniff`` (a browser never guesses
a type, so a JSON body or a stored transcript is never run as a script or a
page), ``Referrer-Policy: no-referrer``, ``X-Frame-Options: DENY`` and a
Content-Security-Policy. HTML gets :data:`PAGE_CSP` (scripts and styles only
from the API's own origin, no inline script, no framing, no form
submissions; the live page keeps its script and style in ``/live.js`` and
``/live.css`` for this); the browsable API docs, when ``api_docs`` turns
them on, get :data:`DOCS_CSP`, which lets them load Swagger UI and ReDoc
from their CDN; anything else gets :data:`NO_CONTENT_CSP`.
"""

from __future__ import annotations

from collections.abc import Collection

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["SecurityHeaders", "PAGE_CSP", "DOCS_CSP", "NO_CONTENT_CSP"]

PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
#: Swagger UI and ReDoc as FastAPI serves them: their scripts and styles from a CDN, an inline start script.
DOCS_CSP = (
    "default-src 'none'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
    "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net https://fonts.googleapis.com; "
    "font-src https://fonts.gstatic.com; img-src 'self' data: https://fastapi.tiangolo.com https://cdn.redoc.ly; "
    "worker-src blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
NO_CONTENT_CSP = "default-src 'none'; frame-ancestors 'none'"


class SecurityHeaders:
    """Adds the module's headers to each HTTP response of ``app``; ``docs_paths`` get :data:`DOCS_CSP`.

    A plain ASGI middleware (not ``BaseHTTPMiddleware``): it edits the response's
    start message only, so streamed responses (SSE) pass through untouched.
    """

    def __init__(self, app: ASGIApp, *, docs_paths: Collection[str] = ()) -> None:
        self.app = app
        self.docs_paths = frozenset(docs_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        docs = scope.get("path") in self.docs_paths

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                html = headers.get("content-type", "").startswith("text/html")
                headers["X-Content-Type-Options"] = "nosniff"
                headers["Referrer-Policy"] = "no-referrer"
                headers["X-Frame-Options"] = "DENY"
                headers["Content-Security-Policy"] = DOCS_CSP if docs else PAGE_CSP if html else NO_CONTENT_CSP
            await send(message)

        await self.app(scope, receive, send_with_headers)
