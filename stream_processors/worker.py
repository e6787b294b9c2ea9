"""Run a Faust app (the sequencer, the finalizer, the bench's Faust baselines) as a worker process."""

from __future__ import annotations

import logging

import faust

from turnlog.kafka import wait_for_broker
from turnlog.settings import TurnlogSettings

__all__ = ["run_worker"]


def run_worker(faust_app: faust.App, settings: TurnlogSettings) -> None:
    """Block running ``faust_app`` until the worker is stopped (SIGTERM, SIGINT)."""
    # A Faust worker exits if it cannot bootstrap; wait for the broker first
    # (a broker outage after start-up is retried by the client itself).
    wait_for_broker(settings)

    class Worker(faust.Worker):  # the class name labels its log lines: "[^Worker]: Ready" is watched for
        def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
            # Faust's terminal spinner leaves the root logger at DEBUG so it can spin
            # on every record: aiokafka then builds a debug record per message sent
            # (10% of the sequencer's CPU in the benchmark's profile). No spinner.
            self.spinner = None
            logger.setLevel(level)

    worker = Worker(faust_app, loglevel=settings.log_level.lower(), quiet=True)
    worker.execute_from_commandline()
