"""The unauthenticated routes: ``GET /healthz``, ``/`` (to ``/live``), the live transcript page
(``/live``, ``/live.js``, ``/live.css``) and the operations page (``/ops``, ``/ops.js``,
``/ops.css``). The pages are static: they hold no data and send the user's token themselves
to the ``/api`` routes."""

from importlib import resources
from typing import Any

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from turnlog.api.context import ApiContext

__all__ = ["page_routes"]

_MEDIA_TYPES = {"html": "text/html", "js": "text/javascript", "css": "text/css"}


def page_routes(context: ApiContext) -> APIRouter:
    """The static pages (read once, here) and the health check."""
    router = APIRouter(include_in_schema=False)
    for name in ("live.html", "live.js", "live.css", "ops.html", "ops.js", "ops.css"):
        text = resources.files("turnlog.api").joinpath(f"static/{name}").read_text("utf-8")
        stem, kind = name.rsplit(".", 1)
        path = f"/{stem}" if kind == "html" else f"/{name}"
        router.add_api_route(path, _static(text, f"{_MEDIA_TYPES[kind]}; charset=utf-8"), methods=["GET"],
                             name=f"page {name}")

    @router.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "live_subscribers": context.hub.subscriber_count if context.hub is not None else None}

    @router.get("/")
    def root() -> RedirectResponse:
        return RedirectResponse("/live")

    return router


def _static(text: str, media_type: str) -> Any:
    def page() -> Response:
        return Response(text, media_type=media_type, headers={"Cache-Control": "no-cache"})

    return page
