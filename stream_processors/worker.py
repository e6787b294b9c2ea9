"""Run a Faust app (the sequencer, the finalizer, the bench's Faust baselines) as a worker process."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import faust
from faust.types import AppT

from turnlog.kafka import wait_for_broker, while_unavailable
from turnlog.kafka.replication import resolve_replication
from turnlog.readiness import mark_not_ready, mark_ready
from turnlog.settings import TurnlogSettings
from turnlog.stream_processors.app import configure_replication

__all__ = ["ReadinessSensor", "run_worker"]


class ReadinessSensor(faust.Sensor):
    """Keeps the worker's ready file (``TURNLOG_READY_FILE``, :mod:`turnlog.readiness`).

    Faust calls a sensor's ``on_rebalance_end`` when a rebalance has fully
    completed: in :class:`~turnlog.stream_processors.recovery.OrderedRecovery`,
    after the tables are recovered, the stream partitions seeked to the
    committed offsets and resumed, and the fetcher running (where it logs
    "Worker ready"); the file is written then. ``on_rebalance_start`` (the
    consumer's revoke callback, the first thing a rebalance does) removes it:
    while a rebalance runs the worker processes nothing. The worker with no
    partition assigned goes through the same completion, so it is ready too.

    Raises:
        OSError: from either callback, when the file cannot be written or
            removed (the worker then stops, naming the path).
    """

    def __init__(self, path: Path | None, component: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = path
        self.component = component

    def on_rebalance_start(self, app: AppT) -> dict[str, Any]:
        state = super().on_rebalance_start(app)
        mark_not_ready(self.path)
        return state

    def on_rebalance_end(self, app: AppT, state: dict[str, Any]) -> None:
        mark_ready(self.path, self.component)


def run_worker(faust_app: faust.App, settings: TurnlogSettings, component: str | None = None) -> None:
    """Block running ``faust_app`` until the worker is stopped (SIGTERM, SIGINT).

    With ``settings.ready_file`` set, the worker keeps that file as
    ``component`` (default: the app's id) while it is ready
    (:class:`ReadinessSensor`), and removes it when it stops. ``faust_app``
    comes from :func:`~turnlog.stream_processors.app.make_app`: the replication
    of the topics it may declare is resolved here, once a broker answers.

    Raises:
        ConfigurationError: the replication settings are inconsistent
            (``turnlog.kafka.replication.replication_for``).
        BrokerError: reading the cluster's metadata failed for a reason waiting does not fix
            (a retriable failure, such as a failover, is waited out).
    """
    # A Faust worker exits if it cannot bootstrap; wait for the broker first
    # (a broker outage after start-up is retried by the client itself).
    wait_for_broker(settings)
    # Any topic Faust declares gets turnlog's replication, resolved against the cluster as it is now.
    configure_replication(faust_app, while_unavailable(lambda: resolve_replication(settings), "reading the cluster"))

    faust_app.sensors.add(ReadinessSensor(settings.ready_file, component or faust_app.conf.id))

    class Worker(faust.Worker):
        def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
            # Faust's terminal spinner leaves the root logger at DEBUG so it can spin
            # on every record: aiokafka then builds a debug record per message sent
            # (10% of the sequencer's CPU in the benchmark's profile). No spinner.
            self.spinner = None
            logger.setLevel(level)

    worker = Worker(faust_app, loglevel=settings.log_level.lower(), quiet=True)
    try:
        worker.execute_from_commandline()
    finally:
        mark_not_ready(settings.ready_file)
