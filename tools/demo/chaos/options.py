"""A chaos run's options (``turnlog chaos``'s flags), and how long it waits for a recovery."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ChaosOptions", "RECOVERY_TIMEOUT_SECONDS"]

#: How long the run waits for a component to come back after a kill, outage or fault, for the
#: pipeline to store again or catch up, and for the spools to drain (seconds); a resume may take
#: the longest outage and this long.
RECOVERY_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True, slots=True)
class ChaosOptions:
    sessions_dir: Path
    duration: float = 300.0
    seed: int = 1
    kills: int = 25
    #: agents SIGKILLed (and resumed) during each broker outage (with ``cluster``: while two brokers are down)
    outage_agent_kills: int = 2
    report_path: Path | None = None
    flush_interval_seconds: float = 0.2
    #: None: ``CHAOS_DELIVERY_TIMEOUT_SECONDS`` on the single broker, the settings' own on the cluster
    delivery_timeout_seconds: float | None = None
    log_dir: Path = Path(".turnlog-chaos")
    state_dir: Path = Path(os.environ.get("TURNLOG_STATE_DIR", Path.home() / ".cache" / "turnlog"))
    #: run on the local 3-node cluster (``deploy/cluster.py``) with its faults instead of the single broker's
    cluster: bool = False
    #: the cluster's state root (``TURNLOG_STATE_DIR`` of its ``deploy/kafka.sh``); None: ``state_dir``. Its
    #: ports are the script's (``TURNLOG_KAFKA_CLUSTER_PORT``, ``TURNLOG_KAFKA_CLUSTER_CONTROLLER_PORT``).
    cluster_state_dir: Path | None = None
    #: a Prometheus file_sd folder: every process gets a metrics port, listed in ``turnlog-chaos.json`` there
    #: (tools/demo/scrape_targets.py); None: no metrics ports
    prometheus_targets: Path | None = None
    #: serve ``turnlog api`` (its operations page, ``/ops``) on this port for the run's length, never killed by
    #: the schedule; its tokens are ``TURNLOG_API_TOKENS`` (one granting "*" reads /ops), its Prometheus
    #: ``TURNLOG_OPS_PROMETHEUS_URL``. None: no API
    ops_port: int | None = None
