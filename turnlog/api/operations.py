"""``GET /api/ops``: the operations page's figures (:class:`turnlog.api.ops.OpsBoard`), for a
token granting every fleet (``"*"``) only: they span all of them."""

# No ``from __future__ import annotations``: FastAPI reads the route signatures at definition time.

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import JSONResponse

from turnlog.api.auth import Scope
from turnlog.api.context import ApiContext

__all__ = ["ops_routes"]


def ops_routes(context: ApiContext) -> APIRouter:
    """The operations figures over ``context``'s board."""
    router = APIRouter()
    Scoped = Annotated[Scope, Depends(context.scope)]

    @router.get("/api/ops")
    async def ops_figures(granted: Scoped) -> JSONResponse:
        """The operations page's figures (``turnlog.api.ops.OpsBoard``; each with a ``state``).
        Read at most once per ``ops_refresh_seconds`` whatever the number of clients; answered
        within about ``OPS_SOURCE_TIMEOUT_SECONDS`` even when Kafka, the store or Prometheus
        hangs (then with that figure's ``state`` ``timeout``). 403: the token does not grant
        every fleet (``"*"``): these figures span all of them."""
        if granted.fleets is not None:
            raise HTTPException(403, "the operations figures span every fleet: they need a token granting \"*\"")
        return JSONResponse(await context.board.figures(), headers={"Cache-Control": "no-store"})

    return router
