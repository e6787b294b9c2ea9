"""Keys for a demo or chaos run: the pipeline runs with write-side isolation on (docs/design.md,
"Write-side isolation"), with content encrypted and the erasure ledger signed (docs/design.md,
"Encryption and erasure"), as a new deployment does."""

from __future__ import annotations

import secrets
from pathlib import Path

from pydantic import SecretStr

from turnlog.crypto.keys import create_keyring_file, public_key_text
from turnlog.crypto.ledger_signatures import new_issuer_key
from turnlog.settings import TurnlogSettings

__all__ = ["DEMO_FLEET", "with_run_keys"]

#: The fleet every demo and chaos agent records as (tools/demo/agent.py).
DEMO_FLEET = "demo"


def with_run_keys(settings: TurnlogSettings, folder: Path) -> TurnlogSettings:
    """``settings`` with fresh random keys for :data:`DEMO_FLEET` and the epoch grants, unless the
    operator configured fleet keys already (then they are used as given); and, unless a KEK is
    configured or ``encryption=off``, a keyring of the run's own in ``folder`` (its public half is
    what the agents get: ``kek_public_key``); and, unless erasure issuers are configured, an
    erasure issuer of the run's own (the run's services sign and check the erasure ledger)."""
    if not settings.erasure_issuers and settings.erasure_issuer_key is None:
        private, issuer_public = new_issuer_key()
        settings = settings.model_copy(update={"erasure_issuer_key": SecretStr(private),
                                               "erasure_issuers": {settings.erasure_issuer: issuer_public}})
    if settings.encryption != "off" and not settings.keyring_file and not settings.kek_public_key:
        public = create_keyring_file(folder / "keyring")
        settings = settings.model_copy(update={"keyring_file": str(folder / "keyring"),
                                               "kek_public_key": public_key_text(public.key)})
    if settings.fleet_keys:
        return settings
    return settings.model_copy(
        update={
            "fleet_keys": {DEMO_FLEET: SecretStr(secrets.token_urlsafe(32))},
            "epoch_grant_key": SecretStr(secrets.token_urlsafe(32)),
        }
    )
