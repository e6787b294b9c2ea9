"""What finished agents left in the run's spool folder: delivered before a harness judges.

An agent that exits while the broker is away (a failover, an outage) leaves its
undelivered events in its spool, which is what the spool is for; the next
recorder started on the host delivers them. A harness whose agents are all
done plays that recorder (as ``turnlog spool-drain`` does), so a session is not
judged lost for events that sit safely on disk, and it reports them apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnlog.producers import SessionRecorder
from turnlog.settings import TurnlogSettings

__all__ = ["SpoolDrain", "drain_orphaned_spools"]


@dataclass(frozen=True, slots=True)
class SpoolDrain:
    """Events found in orphaned spools, and how many of them were still undelivered after the drain."""

    found: int
    undelivered: int


async def drain_orphaned_spools(settings: TurnlogSettings, timeout: float) -> SpoolDrain:
    """Adopt every orphaned spool of ``settings.spool_dir`` and deliver it, for up to ``timeout`` seconds."""
    recorder = SessionRecorder(
        settings.model_copy(update={"spool_close_timeout_seconds": timeout}), producer_id="harness-spool-drain"
    )
    await recorder.start()
    found = recorder.spooled_events()
    await recorder.close()
    return SpoolDrain(found, recorder.spooled_events())
