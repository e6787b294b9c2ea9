"""Faust app factory shared by the sequencer and the finalizer.

Every topic a Faust app declares gets turnlog's replication: the app is resolved
its :class:`~turnlog.kafka.replication.Replication` at worker start
(:func:`configure_replication`, from ``run_worker``), and its topic class
(:class:`ReplicatedTopic`) declares each topic with that replication factor and
``min.insync.replicas``, never the broker's defaults. ``turnlog topics create``
creates the same topics first (``turnlog.kafka.topic_specs``), so
Faust finds them there; this covers a topic it would create itself.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Set
from pathlib import Path

import faust
from aiokafka import errors as aiokafka_errors
from faust.types import TP
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from turnlog.exceptions import ConfigurationError
from turnlog.kafka.faust_auth import faust_credentials
from turnlog.kafka.offsets import OffsetReader
from turnlog.kafka.replication import Replication
from turnlog.kafka.topic_specs import explicit_topic_config
from turnlog.settings import TurnlogSettings
from turnlog.stream_processors.fetching import SnapshotFetchApp
from turnlog.stream_processors.recovery import OrderedTableManager
from turnlog.stream_processors.unreadable_records import PartitionScanner

__all__ = ["make_app", "raw_topic", "TurnlogApp", "ReplicatedTopic", "configure_replication"]

logger = logging.getLogger(__name__)

#: Records an agent's input queue holds (Faust's default: 4096).
STREAM_BUFFER_MAXSIZE = 16384


class TurnlogApp(SnapshotFetchApp):
    """turnlog's Faust app: :class:`SnapshotFetchApp` holding the replication its topics
    are declared with (``topic_replication``, set by :func:`configure_replication`)."""

    topic_replication: Replication | None = None
    #: Awaited with the assigned partitions before their tables are restored (``recovery.py``).
    before_restore: Callable[[Set[TP]], Awaitable[None]] | None = None
    #: ``record_ends(topic, partitions)``: the offset after each partition's last committed record
    #: (``OffsetReader.record_ends``), the end of a changelog restore (``recovery.py``).
    record_ends: Callable[[str, Set[int]], Mapping[int, int]] | None = None


class ReplicatedTopic(faust.Topic):
    """Faust's topic, declared with its app's ``topic_replication``: that replication
    factor, and ``min.insync.replicas`` and ``max.message.bytes`` added to the configs
    Faust gives it (a table's ``extra_topic_configs``, its cleanup policy)."""

    async def declare(self) -> None:
        """Declare the topic on the broker if it does not exist (Faust's ``declare``).

        Raises:
            ConfigurationError: the app's replication was not resolved (an app run
                other than through ``run_worker``): the topic would get the broker's defaults.
        """
        replication = self.app.topic_replication if isinstance(self.app, TurnlogApp) else None
        if replication is None:
            raise ConfigurationError(
                f"Faust would declare topic {self.get_topic_name()} before the app's replication was resolved "
                "(configure_replication, done by run_worker)"
            )
        self.replicas = replication.replication_factor
        self.config = {**(self.config or {}), **explicit_topic_config(replication)}
        # A worker starting while a node is down (a failover, two nodes of three down) asks a
        # controller that does not answer: tried again, as a failover is waited out elsewhere.
        retrying = AsyncRetrying(
            retry=retry_if_exception(_retriable_declare_error),
            stop=stop_after_delay(DECLARE_PATIENCE_SECONDS),
            wait=wait_exponential(multiplier=0.5, max=5.0),
            before_sleep=lambda state: logger.warning(
                "declaring topic %s: the cluster did not answer, trying again: %r", self.get_topic_name(),
                state.outcome.exception() if state.outcome else None,
            ),
            reraise=True,
        )
        await retrying(super().declare)


#: How long a topic declaration waits out a broker outage before the worker fails (seconds).
DECLARE_PATIENCE_SECONDS = 120.0


def _retriable_declare_error(error: BaseException) -> bool:
    """aiokafka's retriable errors (a node not ready, a lost connection, no controller) and timeouts."""
    if isinstance(error, (TimeoutError, aiokafka_errors.KafkaTimeoutError)):
        return True
    return isinstance(error, aiokafka_errors.KafkaError) and bool(getattr(error, "retriable", False))


def configure_replication(app: faust.App, replication: Replication) -> None:
    """Give ``app`` (from :func:`make_app`) the replication of every topic it declares.

    Raises:
        TypeError: ``app`` was not made by :func:`make_app`.
    """
    if not isinstance(app, TurnlogApp):
        raise TypeError(f"{type(app).__name__} is not a TurnlogApp (make it with make_app)")
    app.topic_replication = replication
    app.conf.topic_replication_factor = replication.replication_factor


def make_app(settings: TurnlogSettings, app_id: str, *, commit_interval_seconds: float = 1.0) -> TurnlogApp:
    """A Faust app whose id is the consumer group ``app_id``; at-least-once,
    producer ``acks=all``, offsets committed only after the producer flushed.
    It connects like every other turnlog client (``TURNLOG_KAFKA_*``: TLS, SASL).
    Its topics' replication is resolved at worker start (:func:`configure_replication`)."""
    datadir = Path(settings.faust_data_dir) / app_id
    datadir.parent.mkdir(parents=True, exist_ok=True)
    brokers = [f"kafka://{server.strip()}" for server in settings.bootstrap_servers.split(",")]
    # SnapshotFetchApp: Faust's fetch drops records of paused partitions, and stops at a record
    # aiokafka cannot unpack (fetching.py).
    app = TurnlogApp(
        app_id,
        broker=brokers,
        broker_credentials=faust_credentials(settings),  # None for PLAINTEXT: Faust's default
        store="memory://",
        datadir=str(datadir),
        topic_partitions=settings.partitions,
        Topic=ReplicatedTopic,  # declared with the replication configure_replication gives the app
        topic_allow_declare=True,
        producer_acks=-1,
        # Faust's own producer now carries only the table changelog (the
        # sequencer's emissions go through emitter.py); let it batch.
        producer_linger=settings.producer_linger_ms / 1000.0,
        producer_max_batch_size=256 * 1024,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=commit_interval_seconds,
        web_enabled=False,
        # A SIGKILLed worker holds its partitions until the group's session
        # times out: keep that short so a replacement takes over quickly.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=2.0,
        table_standby_replicas=0,
        # Faust's cost is per record: its repaired Cython fast paths (stream
        # iteration takes records already queued; one decode per message) and a
        # deeper input queue cut it. Both measured in docs/benchmarks.md.
        cython_optimizations=True,
        stream_buffer_maxsize=STREAM_BUFFER_MAXSIZE,
        # Faust's recovery completion drops fetched records (faust-streaming#596): see recovery.py.
        TableManager=OrderedTableManager,
    )
    app.partition_scanner = PartitionScanner(settings)  # reads a partition where aiokafka cannot unpack it
    app.record_ends = OffsetReader(settings).record_ends  # a changelog written in transactions ends in markers
    return app


def raw_topic(app: faust.App, name: str) -> faust.TopicT:
    """A topic of raw bytes keys and values (turnlog validates JSON itself)."""
    return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
