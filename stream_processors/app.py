"""Faust app factory shared by the sequencer and the finalizer."""

from __future__ import annotations

from pathlib import Path

import faust

from turnlog.kafka.faust_auth import faust_credentials
from turnlog.settings import TurnlogSettings
from turnlog.stream_processors.fetching import SnapshotFetchApp
from turnlog.stream_processors.recovery import OrderedTableManager
from turnlog.stream_processors.unreadable_records import PartitionScanner

__all__ = ["make_app", "raw_topic"]

#: Records an agent's input queue holds (Faust's default: 4096).
STREAM_BUFFER_MAXSIZE = 16384


def make_app(settings: TurnlogSettings, app_id: str, *, commit_interval_seconds: float = 1.0) -> faust.App:
    """A Faust app whose id is the consumer group ``app_id``; at-least-once,
    producer ``acks=all``, offsets committed only after the producer flushed.
    It connects like every other turnlog client (``TURNLOG_KAFKA_*``: TLS, SASL)."""
    datadir = Path(settings.faust_data_dir) / app_id
    datadir.parent.mkdir(parents=True, exist_ok=True)
    brokers = [f"kafka://{server.strip()}" for server in settings.bootstrap_servers.split(",")]
    # SnapshotFetchApp: Faust's fetch drops records of paused partitions, and stops at a record
    # aiokafka cannot unpack (fetching.py).
    app = SnapshotFetchApp(
        app_id,
        broker=brokers,
        broker_credentials=faust_credentials(settings),  # None for PLAINTEXT: Faust's default
        store="memory://",
        datadir=str(datadir),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
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
    return app


def raw_topic(app: faust.App, name: str) -> faust.TopicT:
    """A topic of raw bytes keys and values (turnlog validates JSON itself)."""
    return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
