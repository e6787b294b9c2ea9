"""Run the store's Alembic migrations programmatically (``turnlog migrate``)."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from tenacity import before_sleep_log, retry, retry_if_exception_type, wait_exponential

from turnlog.sinks import safe_url
from turnlog.sinks.driver_errors import store_errors
from turnlog.sinks.exceptions import StoreError, StoreUnavailableError

__all__ = ["upgrade_to_head", "require_head", "wait_for_head", "MIGRATIONS_DIR"]

logger = logging.getLogger(__name__)
MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def upgrade_to_head(engine: Engine) -> None:
    """Bring the database behind ``engine`` to the newest schema (idempotent)."""
    config = _config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
    logger.info("store schema is at head (%s)", safe_url(engine.url))


def require_head(engine: Engine) -> None:
    """Check, at a service's start, that the schema is at the newest revision.

    Raises:
        StoreUnavailableError: the database does not answer.
        StoreError: the schema is missing or older; the message says to run ``turnlog migrate``.
    """
    head = ScriptDirectory.from_config(_config()).get_current_head()
    with store_errors(), engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    if current != head:
        where = safe_url(engine.url)
        raise StoreError(f"store {where} is at schema revision {current or 'none'}, not {head}: run `turnlog migrate`")


@retry(
    retry=retry_if_exception_type(StoreUnavailableError),
    wait=wait_exponential(multiplier=0.5, max=10),
    before_sleep=before_sleep_log(logger, logging.WARNING),
    reraise=True,
)
def wait_for_head(engine: Engine) -> None:
    """:func:`require_head`, waiting (backoff up to 10 s, without limit) while the database
    does not answer: a service started during a database outage waits for it instead
    of exiting in a crash loop.

    Raises:
        StoreError: the schema is missing or older (not retried).
    """
    require_head(engine)
