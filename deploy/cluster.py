"""Control the local KRaft cluster that ``deploy/kafka.sh`` runs with ``TURNLOG_KAFKA_NODES=3``.

For the cluster tests and ``turnlog chaos --cluster``: start it, find each node's
process, SIGKILL, SIGSTOP/SIGCONT or restart one node, roll through all of them
as an operator's rollout does, and read who leads a partition and which
replicas are in its ISR. Starting and stopping go through the script (one
implementation of the node layout); signals go straight to the node's pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from turnlog.exceptions import ConfigurationError
from turnlog.polling import wait_until

__all__ = ["LocalCluster", "PartitionReplicas", "CLUSTER_NODES"]

SCRIPT = Path(__file__).parent / "kafka.sh"
CLUSTER_NODES = 3


@dataclass(frozen=True, slots=True)
class PartitionReplicas:
    """One partition's leader (node id; -1: none), its replicas and its in-sync replicas (node ids)."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


class LocalCluster:
    """The local cluster of ``nodes`` combined broker+controller nodes (ids 1..nodes).

    ``state_dir``: the scripts' state root (``TURNLOG_STATE_DIR``; default ``~/.cache/turnlog``).
    Methods that wait take ``timeout`` in seconds; those that poll raise
    :class:`~turnlog.polling.WaitTimeoutError` (a :class:`TimeoutError`) past it;
    a failed script raises :class:`ConfigurationError` with its output.
    """

    def __init__(self, state_dir: Path | None = None, nodes: int = CLUSTER_NODES) -> None:
        self.state_dir = state_dir or Path(os.environ.get("TURNLOG_STATE_DIR", Path.home() / ".cache" / "turnlog"))
        self.nodes = nodes
        self.bootstrap_servers = self._script("bootstrap").strip()

    @property
    def node_ids(self) -> range:
        return range(1, self.nodes + 1)

    # -- processes -------------------------------------------------------------
    def start(self, node: int | None = None, *, timeout: float = 180) -> None:
        """Start ``node`` (or every node that is down), wait until it answers, then until the
        cluster's metadata lists it (or every node): a node answers on its port before the
        controller has registered it, and a client asking meanwhile counts one broker too few."""
        started = time.monotonic()
        self._script("start", *([str(node)] if node else []), timeout=timeout)
        wanted = {node} if node else set(self.node_ids)
        wait_until(lambda: wanted <= self.registered(), timeout=max(10.0, timeout - (time.monotonic() - started)),
                   what=f"the cluster's metadata to list node(s) {sorted(wanted)}", interval=0.2)

    def stop(self, node: int | None = None, *, timeout: float = 180) -> None:
        """Stop ``node`` (or every node) cleanly: SIGTERM, as a rolling restart does."""
        self._script("stop", *([str(node)] if node else []), timeout=timeout)

    def running(self) -> bool:
        """True when every node's process runs (stopped by SIGSTOP counts as running)."""
        return all(self.pid(node) is not None for node in self.node_ids)

    def pid(self, node: int) -> int | None:
        """The node's broker process, or None when it does not run."""
        pid_file = self.state_dir / "kafka-cluster" / f"node-{node}" / "kafka.pid"
        try:
            pid = int(pid_file.read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            return None
        return pid if b"kafka.Kafka" in cmdline else None

    def kill(self, node: int, *, timeout: float = 30) -> None:
        """SIGKILL the node and wait until its process is gone."""
        pid = self._require_pid(node)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=timeout, what=f"node {node} (pid {pid}) to exit",
                   interval=0.2)

    def pause(self, node: int) -> None:
        """SIGSTOP the node: it holds its ports and answers nothing (a GC pause, a frozen VM)."""
        os.kill(self._require_pid(node), signal.SIGSTOP)

    def resume(self, node: int) -> None:
        """SIGCONT a paused node."""
        os.kill(self._require_pid(node), signal.SIGCONT)

    def resume_all(self) -> None:
        """SIGCONT every node that runs (harmless on one that is not stopped)."""
        for node in self.node_ids:
            pid = self.pid(node)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def rolling_restart(self, topics: Iterable[str], *, timeout: float = 180) -> None:
        """Restart the nodes one by one, each after every partition of ``topics`` has its
        full ISR again (an operator's rollout: never take a node while another is catching up)."""
        topics = list(topics)
        for node in self.node_ids:
            self.wait_isr_full(topics, timeout=timeout)
            self.stop(node, timeout=timeout)
            self.start(node, timeout=timeout)
        self.wait_isr_full(topics, timeout=timeout)

    # -- metadata --------------------------------------------------------------
    def registered(self, *, timeout: float = 5) -> set[int]:
        """The node ids the cluster's metadata lists as brokers now (empty if none answered)."""
        try:
            return set(self._metadata(timeout).brokers)
        except TimeoutError:
            return set()

    def partitions(self, topics: Iterable[str], *, timeout: float = 10) -> list[PartitionReplicas]:
        """The replicas of every partition of ``topics``, from the cluster's metadata.

        Raises:
            TimeoutError: no node answered a metadata request within ``timeout``.
        """
        metadata = self._metadata(timeout)
        found = []
        for topic in topics:
            described = metadata.topics.get(topic)
            if described is None:
                continue
            for partition in sorted(described.partitions.values(), key=lambda p: p.id):
                found.append(PartitionReplicas(
                    topic, partition.id, partition.leader, tuple(partition.replicas), tuple(partition.isrs)
                ))
        return found

    def _metadata(self, timeout: float) -> ClusterMetadata:
        """The cluster's metadata, as the first node to answer gives it.

        Raises:
            TimeoutError: no node answered a metadata request within ``timeout``.
        """
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        try:
            return admin.list_topics(timeout=timeout)
        except KafkaException as e:  # no broker answered in time
            raise TimeoutError(f"no node of {self.bootstrap_servers} answered a metadata request: {e}") from e

    def leader_of(self, topic: str, partition: int) -> int:
        """The node leading ``topic``/``partition`` now (-1: none)."""
        for replicas in self.partitions([topic]):
            if replicas.partition == partition:
                return replicas.leader
        raise ConfigurationError(f"no partition {topic}/{partition} in the cluster's metadata")

    def busiest_leader(self, topics: Iterable[str]) -> int:
        """The node leading the most partitions of ``topics`` (the one whose loss moves the most)."""
        leaders = [p.leader for p in self.partitions(topics) if p.leader > 0]
        if not leaders:
            raise ConfigurationError("no partition of the topics has a leader")
        return max(set(leaders), key=leaders.count)

    def wait_isr_full(self, topics: Iterable[str], *, timeout: float = 180) -> None:
        """Until every partition of ``topics`` has a leader and all its replicas in sync."""
        topics = list(topics)

        def full() -> bool:
            try:
                described = self.partitions(topics)
            except TimeoutError:
                return False
            return bool(described) and all(p.leader > 0 and set(p.isr) == set(p.replicas) for p in described)

        wait_until(full, timeout=timeout, what=f"a full ISR on every partition of {', '.join(topics)}", interval=0.2)

    # -- internals -------------------------------------------------------------
    def _require_pid(self, node: int) -> int:
        pid = self.pid(node)
        if pid is None:
            raise ConfigurationError(f"node {node} of the local cluster does not run")
        return pid

    def _script(self, *args: str, timeout: float = 60) -> str:
        # The script waits for a started node nearly as long as the caller does: a node that
        # restarts on a busy machine reads every partition it holds first.
        env = {"TURNLOG_KAFKA_START_TIMEOUT": str(max(30, int(timeout) - 10)), **os.environ,
               "TURNLOG_KAFKA_NODES": str(self.nodes), "TURNLOG_STATE_DIR": str(self.state_dir)}
        result = subprocess.run(
            ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise ConfigurationError(
                f"`TURNLOG_KAFKA_NODES={self.nodes} bash {SCRIPT} {' '.join(args)}` failed (exit "
                f"{result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
            )
        return result.stdout
