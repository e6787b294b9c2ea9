"""What is particular to ``turnlog chaos --cluster``: the local 3-node KRaft cluster
(``turnlog.deploy.cluster.LocalCluster``) started for the run, its topics' replication, the
workers run on it (two sequencers, two sinks, one finalizer), and its broker faults, one at a
time: the busiest leader SIGKILLed, a rolling restart, one node SIGSTOPped, two nodes down."""

from __future__ import annotations

import logging
import subprocess
import time
from typing import Any

from turnlog.deploy.cluster import LocalCluster
from turnlog.exceptions import ConfigurationError
from turnlog.tools.demo.chaos.faults import kill_agent
from turnlog.tools.demo.chaos.options import RECOVERY_TIMEOUT_SECONDS, ChaosOptions
from turnlog.tools.demo.chaos.report import _fault_label
from turnlog.tools.demo.chaos.state import _Run
from turnlog.tools.demo.chaos.watch import wait_caught_up
from turnlog.tools.demo.schedule import AFTER_OUTAGE_SECONDS, PlannedFault

__all__ = ["CLUSTER_WORKERS", "CLUSTER_REPLICATION_FACTOR", "start_cluster", "cluster_settings",
           "run_broker_faults", "run_broker_fault"]

logger = logging.getLogger(__name__)
#: The cluster mode's workers (name -> service): two of the sequencer and of the sink, one finalizer.
CLUSTER_WORKERS = {"sequencer": "sequencer", "sequencer-2": "sequencer", "sink": "sink", "sink-2": "sink",
                   "finalizer": "finalizer"}
#: The cluster mode's topics: this many replicas, min ISR one less.
CLUSTER_REPLICATION_FACTOR = 3


def start_cluster(options: ChaosOptions) -> LocalCluster:
    """The local cluster of ``options`` (its state dir), every node that is down started."""
    cluster = LocalCluster(options.cluster_state_dir or options.state_dir)
    if not cluster.running():
        print(f"starting the local {cluster.nodes}-node cluster ({cluster.bootstrap_servers})", flush=True)
    cluster.start()  # every node that is down
    return cluster


def cluster_settings(cluster: LocalCluster) -> dict[str, Any]:
    """The settings a run on ``cluster`` overrides: its bootstrap servers and the topics' replication."""
    return {
        "bootstrap_servers": cluster.bootstrap_servers,
        "replication_factor": CLUSTER_REPLICATION_FACTOR,
        "min_insync_replicas": CLUSTER_REPLICATION_FACTOR - 1,
    }


# -- the cluster's faults --
def run_broker_faults(run: _Run, faults: list[PlannedFault]) -> None:
    """The broker faults one after the other, each once the one before has recovered
    (every node back, the ISR full, the pipeline caught up) and ``AFTER_OUTAGE_SECONDS`` later."""
    for planned in faults:
        run.sleep_until(planned.at)
        run_broker_fault(run, planned)
        time.sleep(AFTER_OUTAGE_SECONDS)


def run_broker_fault(run: _Run, planned: PlannedFault) -> None:
    cluster = run.cluster
    assert cluster is not None
    at = run.now()
    with run.our("cluster"):
        try:
            target, lifted = _hold_broker_fault(run, cluster, planned, at)
            held = lifted - (run.started + at)  # a rolling restart: from its first stop to its last step's start
            cluster.wait_isr_full(run.topics, timeout=RECOVERY_TIMEOUT_SECONDS)
            isr_full = time.monotonic()
        except BaseException:
            cluster.resume_all()  # whatever failed, leave no node stopped or down
            cluster.start()
            raise
        finally:
            with run.lock:
                run.outage = None
            run.brokers_whole.set()
    caught_up = wait_caught_up(run, lifted, RECOVERY_TIMEOUT_SECONDS)
    entry: dict[str, Any] = {
        "at_seconds": round(at, 1), "action": "fault", "component": _fault_label(planned), "target": target,
        "down_seconds": round(held, 1),
        "lifted_at_seconds": round(lifted - run.started, 1),
        "isr_full_seconds": round(isr_full - lifted, 2),
        "recovery_seconds": round(caught_up, 2) if caught_up is not None else None,
        "agents_killed_meanwhile": len(planned.agent_kills),
    }
    if caught_up is None:
        entry["error"] = f"the pipeline did not catch up within {RECOVERY_TIMEOUT_SECONDS:.0f}s"
    run.record(entry)


def _hold_broker_fault(run: _Run, cluster: LocalCluster, planned: PlannedFault, at: float) -> tuple[str, float]:
    """Inflict ``planned`` (begun at ``at``, run time) for its hold, then lift it: what it hit, and
    when it was lifted (monotonic)."""
    events = run.settings.topics.events
    if planned.kind == "leader_kill":
        node = cluster.busiest_leader([events])
        led = sum(1 for p in cluster.partitions([events]) if p.leader == node)
        cluster.kill(node)
        target = f"node {node} (led {led} of {run.settings.partitions} events partitions)"
        run.sleep_until(at + planned.hold_seconds)
        lifted = time.monotonic()
        cluster.start(node)
    elif planned.kind == "broker_pause":
        node = run.fault_rng.choice(list(cluster.node_ids))
        led = sum(1 for p in cluster.partitions([events]) if p.leader == node)
        cluster.pause(node)
        target = f"node {node} (led {led} of {run.settings.partitions} events partitions)"
        run.sleep_until(at + planned.hold_seconds)
        lifted = time.monotonic()
        cluster.resume(node)
    elif planned.kind == "two_brokers_down":
        nodes = sorted(run.fault_rng.sample(list(cluster.node_ids), 2))
        run.brokers_whole.clear()
        with run.lock:
            run.outage = "two brokers"  # agents killed from now on are killed during it
        for node in nodes:
            cluster.kill(node)
        target = f"nodes {nodes[0]} and {nodes[1]}"
        for offset in planned.agent_kills:
            run.sleep_until(at + offset)
            kill_agent(run, during="two brokers down")
        run.sleep_until(at + planned.hold_seconds)
        lifted = time.monotonic()
        cluster.start()
    elif planned.kind == "rolling_restart":
        cluster.rolling_restart(run.topics, timeout=RECOVERY_TIMEOUT_SECONDS)
        lifted = time.monotonic()
        target = f"nodes {', '.join(map(str, cluster.node_ids))}, one by one"
    else:
        raise ConfigurationError(f"unknown broker fault {planned.kind!r}")
    return target, lifted


def _ensure_cluster_up(cluster: LocalCluster) -> None:
    """Leave every node of the cluster running and none stopped (other tests use it too)."""
    cluster.resume_all()
    try:
        cluster.start()
    except (ConfigurationError, subprocess.TimeoutExpired):
        logger.exception("chaos: the local cluster did not start again; start it: TURNLOG_KAFKA_NODES=3"
                         " bash deploy/kafka.sh start")
