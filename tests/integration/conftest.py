"""The pipeline fixture: sequencer and sink (which finalizes sessions in its
batches) as real processes on the real broker and Postgres, with topics and
consumer groups unique to the run; tests that need the finalizer's sweep start
it themselves."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from turnlog import kafka
from turnlog.crypto.keys import create_keyring_file
from turnlog.deploy.processes import ServiceProcess, start_pipeline, stop_all, wait_all_ready
from turnlog.deploy.topics import create_topics, delete_topics_with_prefix
from turnlog.readiness import NotReadyError
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore, open_store
from turnlog.sinks.migrate import upgrade_to_head
from turnlog.sinks.service import SinkService

from tests.support import FIXTURE_FLEET_KEYS, FIXTURE_GRANT_KEY


def isolated_settings(kafka_bootstrap: str, database_url: str, tmp: Path, **overrides: object) -> TurnlogSettings:
    """Settings with their own topics, consumer groups and Faust data dir, and a KEK keyring of their
    own (``tmp/keyring``): every recorder seals content and every reader opens it, as in a new
    deployment (``encryption="off"`` or ``keyring_file=None`` in ``overrides`` leaves content in clear);
    fleet keys for ``FIXTURE_FLEETS`` and an epoch grant key, so every record is authenticated
    (``insecure_open_fleets=True`` in ``overrides`` runs open, ``fleet_keys`` gives other keys)."""
    run = uuid.uuid4().hex[:10]
    # Fleet keys and an epoch grant key, as a deployment has them (tests/support.py: every fleet the
    # tests write as; provenance() signs a raw record), unless a test gives its own keys or runs open.
    keys: dict[str, object] = (
        {} if "fleet_keys" in overrides or overrides.get("insecure_open_fleets")
        else {"fleet_keys": FIXTURE_FLEET_KEYS, "epoch_grant_key": FIXTURE_GRANT_KEY}
    )
    keyring = tmp / "keyring"
    if not keyring.exists():
        create_keyring_file(keyring)
    return TurnlogSettings(
        bootstrap_servers=kafka_bootstrap,
        database_url=database_url,
        topic_prefix=f"test-{run}",
        partitions=3,
        sequencer_group=f"test-{run}-sequencer",
        sink_group=f"test-{run}-sink",
        finalizer_group=f"test-{run}-finalizer",
        analytics_group=f"test-{run}-analytics",
        flush_interval_seconds=0.2,
        finalizer_sweep_seconds=0.5,
        faust_data_dir=str(tmp / "faust"),
        **{"spool_dir": str(tmp / "spool"), "keyring_file": str(keyring), **keys, **overrides},
    )


def drop_topics(settings: TurnlogSettings) -> None:
    """Delete the run's topics (Faust's included): the shared broker loads every topic it
    keeps at each restart, and the crash tests restart it. Best effort: a topic left over
    only costs the broker."""
    with contextlib.suppress(kafka.BrokerError):
        delete_topics_with_prefix(settings, settings.topic_prefix, timeout=10.0)


@dataclass
class Pipeline:
    settings: TurnlogSettings
    store: SqlStore
    processes: dict[str, ServiceProcess]
    log_dir: Path

    def start(self, *services: str, faults: str | None = None, env: dict[str, str] | None = None) -> None:
        """Start services; ``faults`` arms fault points in them (``TURNLOG_FAULTS``); ``env`` adds
        to their environment."""
        extra_env = {**({"TURNLOG_FAULTS": faults} if faults else {}), **(env or {})}
        self.processes.update(start_pipeline(self.settings, self.log_dir, services=services, extra_env=extra_env))

    def stop(self, *services: str) -> None:
        stop_all([self.processes.pop(name) for name in services])

    def wait_ready(self, timeout: float = 120) -> None:
        """Until every running service has written its ready file (turnlog/readiness.py: a Faust worker
        after its rebalance completed, the sink with its assignment, the API following the transcript)."""
        try:
            wait_all_ready(self.processes, timeout)
        except NotReadyError as e:
            raise AssertionError(f"services not ready: {e}\n{self.logs()}") from None

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{p.log_path.read_text(errors='replace')[-3000:]}" for name, p in self.processes.items())


def make_pipeline(
    kafka_bootstrap: str, database_url: str, tmp: Path, services: tuple[str, ...], **overrides: object
) -> Pipeline:
    settings = isolated_settings(kafka_bootstrap, database_url, tmp, **overrides)
    store = open_store(settings.database_url)
    upgrade_to_head(store.engine)
    create_topics(settings)
    pipeline = Pipeline(settings, store, {}, tmp / "logs")
    pipeline.start(*services)
    return pipeline


def pipelines(kafka_bootstrap: str, postgres_databases, tmp_path: Path, **defaults: object) -> Iterator[object]:
    """The body of a pipeline-factory fixture: yields ``make(services, **settings)`` (settings over
    ``defaults``), each pipeline with its own topics, groups and database; stops them all at the end."""
    started: list[Pipeline] = []

    def make(services: tuple[str, ...], **overrides: object) -> Pipeline:
        made = make_pipeline(
            kafka_bootstrap, postgres_databases.create(), tmp_path / uuid.uuid4().hex[:6], services,
            **{**defaults, **overrides},
        )
        started.append(made)
        return made

    yield make
    for made in started:
        stop_all(made.processes)
        made.store.engine.dispose()
        drop_topics(made.settings)


@pytest.fixture
def new_pipeline(kafka_bootstrap: str, postgres_databases, tmp_path: Path) -> Iterator[object]:
    """``new_pipeline(services, **settings)``: a pipeline of its own (topics, groups, database), stopped at the end."""
    yield from pipelines(kafka_bootstrap, postgres_databases, tmp_path)


@pytest.fixture(scope="module")
def pipeline(kafka_bootstrap: str, postgres_databases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """The pipeline on a fresh Postgres database, shared by a module's tests. No
    finalizer: what is finalized here, the sink finalized."""
    tmp = tmp_path_factory.mktemp("pipeline")
    running = make_pipeline(kafka_bootstrap, postgres_databases.create(), tmp, ("sequencer", "sink"))
    yield running
    stop_all(running.processes)
    running.store.engine.dispose()
    drop_topics(running.settings)


@pytest.fixture
def transcript(kafka_bootstrap: str, postgres_databases, tmp_path: Path) -> Iterator[tuple[TurnlogSettings, SqlStore]]:
    """Topics and a migrated store of their own; no service runs (each test runs its own, e.g.
    a :class:`RunningService`)."""
    settings = isolated_settings(kafka_bootstrap, postgres_databases.create(), tmp_path)
    store = open_store(settings.database_url)
    upgrade_to_head(store.engine)
    create_topics(settings)
    yield settings, store
    store.engine.dispose()
    drop_topics(settings)


class RunningService:
    """A SinkService on a thread of this process (so a test can patch what it plans with)."""

    def __init__(self, service: SinkService) -> None:
        self.service = service
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"test-{service.component}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.service.run()
        except BaseException as e:  # the test asserts there is none
            self.failure = e

    def stop(self) -> None:
        self.service.stopping.set()
        self.thread.join(30)
