"""Signing keys for a demo or chaos run: the pipeline runs with write-side isolation on
(docs/design.md, "Write-side isolation"), as production should."""

from __future__ import annotations

import secrets

from pydantic import SecretStr

from turnlog.settings import TurnlogSettings

__all__ = ["DEMO_FLEET", "with_run_keys"]

#: The fleet every demo and chaos agent records as (tools/demo/agent.py).
DEMO_FLEET = "demo"


def with_run_keys(settings: TurnlogSettings) -> TurnlogSettings:
    """``settings`` with fresh random keys for :data:`DEMO_FLEET` and the epoch grants, unless
    the operator configured fleet keys already (then they are used as given)."""
    if settings.fleet_keys:
        return settings
    return settings.model_copy(
        update={
            "fleet_keys": {DEMO_FLEET: SecretStr(secrets.token_urlsafe(32))},
            "epoch_grant_key": SecretStr(secrets.token_urlsafe(32)),
        }
    )
