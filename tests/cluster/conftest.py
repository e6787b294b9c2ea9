"""The cluster tests: a local 3-node KRaft cluster (``deploy/kafka.sh`` with ``TURNLOG_KAFKA_NODES=3``),
started once for this package and stopped after it when this run started it; pipelines on it as the
integration tests build them (their own topics, groups and database), with RF 3 and min ISR 2.

After each test every node runs again (a test that killed or paused one leaves it to this fixture),
so a failed test does not leave the next one a broken cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnlog.deploy.cluster import LocalCluster
from turnlog.settings import TurnlogSettings

from tests.integration.conftest import isolated_settings, pipelines


class ClusterUnderTest(LocalCluster):
    """The local cluster, with settings for a run of its own on it."""

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp

    def settings(self, **overrides: object) -> TurnlogSettings:
        """Settings on the cluster with their own topics and groups (RF 3 unless overridden)."""
        tmp = self.tmp / uuid.uuid4().hex[:6]
        database_url = overrides.pop("database_url", f"sqlite:///{tmp / 'store.db'}")
        return isolated_settings(
            self.bootstrap_servers, str(database_url), tmp, **{"replication_factor": 3, **overrides}
        )


@pytest.fixture(scope="package")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterUnderTest]:
    cluster = ClusterUnderTest(tmp_path_factory.mktemp("cluster"))
    started_here = not cluster.running()
    cluster.start()
    yield cluster
    cluster.resume_all()
    if started_here:
        cluster.stop()


@pytest.fixture(autouse=True)
def every_node_back(kafka_cluster: ClusterUnderTest) -> Iterator[None]:
    yield
    kafka_cluster.resume_all()
    kafka_cluster.start()


@pytest.fixture
def cluster_pipeline(kafka_cluster: ClusterUnderTest, postgres_databases, tmp_path: Path) -> Iterator[object]:
    """``cluster_pipeline(services, **settings)``: a pipeline of its own on the cluster (RF 3), stopped at the end."""
    yield from pipelines(kafka_cluster.bootstrap_servers, postgres_databases, tmp_path, replication_factor=3)
