"""Start the local Kafka broker and Postgres (``deploy/*.sh``) when a command needs them and they are down."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from pydantic import SecretStr

from turnlog import kafka
from turnlog.exceptions import ConfigurationError
from turnlog.redact import redact
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store, parse_database_url, safe_url

__all__ = ["ensure_local_services", "broker_answers", "is_local_default_broker", "LOCAL_DEFAULT_BROKERS"]

logger = logging.getLogger(__name__)
SCRIPTS = Path(__file__).parent
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
#: The bootstrap servers of the single local broker (``deploy/kafka.sh start``, default port).
LOCAL_DEFAULT_BROKERS = frozenset({"127.0.0.1:9092", "localhost:9092"})
#: ``deploy/kafka.sh``'s environment for that broker: one node on the default ports.
SINGLE_BROKER_ENVIRONMENT = {"TURNLOG_KAFKA_NODES": "1", "TURNLOG_KAFKA_PORT": "9092",
                             "TURNLOG_KAFKA_CONTROLLER_PORT": "9093"}


def broker_answers(settings: TurnlogSettings, timeout: float = 5.0) -> bool:
    """True if a broker of ``settings`` answers within ``timeout`` seconds
    (see :func:`turnlog.kafka.broker_answers`)."""
    return kafka.broker_answers(settings, timeout)


def _database_answers(url: str | SecretStr) -> bool:
    store = open_store(url)
    try:
        return store.answers()
    finally:
        store.close()


def is_local_default_broker(bootstrap_servers: str) -> bool:
    """True when ``bootstrap_servers`` (comma separated ``host:port``) name only the single local
    broker ``deploy/kafka.sh`` starts by default (:data:`LOCAL_DEFAULT_BROKERS`)."""
    servers = {server.strip() for server in bootstrap_servers.split(",") if server.strip()}
    return bool(servers) and servers <= LOCAL_DEFAULT_BROKERS


def ensure_local_services(settings: TurnlogSettings) -> None:
    """Start the local broker / Postgres with the deploy scripts if they are down. The broker
    is started only when the bootstrap servers are the local default (127.0.0.1:9092 or
    localhost:9092): any other servers, a local cluster's included, are left to their operator.

    Raises:
        ConfigurationError: no broker answers at bootstrap servers other than the local
            default (the message says how to start the local 3-node cluster when they are
            local), a remote Postgres does not answer, or a deploy script failed (its output
            says why).
    """
    if not broker_answers(settings):
        servers = settings.bootstrap_servers
        if not is_local_default_broker(servers):
            hosts = {server.strip().rsplit(":", 1)[0].strip("[]") for server in servers.split(",") if server.strip()}
            how = ""
            if hosts <= LOCAL_HOSTS:
                how = (" (the local 3-node cluster starts with `TURNLOG_KAFKA_NODES=3 bash deploy/services.sh start`; "
                       "turnlog starts only the single local broker at 127.0.0.1:9092 itself)")
            raise ConfigurationError(f"no Kafka broker answers at {redact(servers)}{how}")
        # The single broker at the default port, whatever TURNLOG_KAFKA_* this process was given.
        _run_script("kafka.sh", **SINGLE_BROKER_ENVIRONMENT)
    database = parse_database_url(settings.database_url)
    if database.get_backend_name() == "postgresql" and not _database_answers(settings.database_url):
        if database.host not in LOCAL_HOSTS:
            raise ConfigurationError(f"no Postgres answers at {safe_url(database)}")
        _run_script("postgres.sh")


def _run_script(name: str, **environment: str) -> None:
    """``bash deploy/<name> start``, with ``environment`` on top of this process's.

    Raises:
        ConfigurationError: the script failed.
    """
    logger.info("starting the local service: bash %s start", SCRIPTS / name)
    result = subprocess.run(["bash", str(SCRIPTS / name), "start"], check=False, env={**os.environ, **environment})
    if result.returncode != 0:
        raise ConfigurationError(f"`bash {SCRIPTS / name} start` failed (exit {result.returncode}); "
                                 "see its output above")
