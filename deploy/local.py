"""Start the local Kafka broker and Postgres (``deploy/*.sh``) when a command needs them and they are down."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from pydantic import SecretStr
from sqlalchemy import text

from turnlog import kafka
from turnlog.exceptions import ConfigurationError
from turnlog.redact import redact
from turnlog.settings import TurnlogSettings
from turnlog.sinks import StoreUnavailableError, open_store, parse_database_url, safe_url
from turnlog.sinks.errors import store_errors

__all__ = ["ensure_local_services", "broker_answers"]

logger = logging.getLogger(__name__)
SCRIPTS = Path(__file__).parent
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def broker_answers(settings: TurnlogSettings, timeout: float = 5.0) -> bool:
    """True if a broker of ``settings`` answers within ``timeout`` seconds
    (see :func:`turnlog.kafka.broker_answers`)."""
    return kafka.broker_answers(settings, timeout)


def _database_answers(url: str | SecretStr) -> bool:
    store = open_store(url)
    try:
        with store_errors(), store.engine.connect() as conn:
            conn.execute(text("select 1"))
        return True
    except StoreUnavailableError:
        return False
    finally:
        store.engine.dispose()


def ensure_local_services(settings: TurnlogSettings) -> None:
    """Start the local broker / Postgres with the deploy scripts if they are down.

    Raises:
        ConfigurationError: a remote service does not answer (turnlog starts only
            local ones), or a deploy script failed (its output says why).
    """
    if not broker_answers(settings):
        hosts = {server.rsplit(":", 1)[0].strip("[]") for server in settings.bootstrap_servers.split(",")}
        if not hosts <= LOCAL_HOSTS:
            raise ConfigurationError(f"no Kafka broker answers at {redact(settings.bootstrap_servers)}")
        _run_script("kafka.sh")
    database = parse_database_url(settings.database_url)
    if database.get_backend_name() == "postgresql" and not _database_answers(settings.database_url):
        if database.host not in LOCAL_HOSTS:
            raise ConfigurationError(f"no Postgres answers at {safe_url(database)}")
        _run_script("postgres.sh")


def _run_script(name: str) -> None:
    logger.info("starting the local service: bash %s start", SCRIPTS / name)
    result = subprocess.run(["bash", str(SCRIPTS / name), "start"], check=False)
    if result.returncode != 0:
        raise ConfigurationError(f"`bash {SCRIPTS / name} start` failed (exit {result.returncode}); "
                                 "see its output above")
