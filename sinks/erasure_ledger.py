"""Writing the erasure ledger (``<prefix>.erasures``) and the sink's periodic erasure duties.

:func:`publish_erasures` produces ledger records (key = session id, on the
session's partition: the ledger is co-partitioned with the transcript) and
returns those the broker acknowledged. :class:`ErasureDuties` is what the
transcript sink runs between batches, at most every ``interval`` seconds:
publish the erasures the store holds as pending (a request made while the
broker was away), and, at most every ``sweep_interval`` seconds (sooner while
a backlog fills whole batches), the retention sweep (sessions past
``TURNLOG_RETENTION_DAYS`` get a pending erasure, published the same way).
At start it warns about each topic whose retention outlives the store's policy
or the erasure deadline (:meth:`ErasureDuties.warn_if_log_outlives_policy`).
Nothing here logs content; log lines name sessions and counts.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Sequence

import msgspec
from confluent_kafka import KafkaError, Message, Producer

from turnlog import kafka
from turnlog.crypto.ledger_signatures import LedgerSigner, ledger_signer
from turnlog.kafka.log_retention import LogOutlivesPolicy, log_outlives_policy
from turnlog.kafka.partitioning import partition_for
from turnlog.schemas.erasure import Erasure, encode_erasure
from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import SqlStore
from turnlog.sinks.driver_errors import store_errors
from turnlog.sinks.exceptions import StoreUnavailableError

__all__ = ["publish_erasures", "ledger_key", "ErasureDuties", "retention_cutoffs"]

logger = logging.getLogger(__name__)
#: How often the sink publishes pending erasures (seconds).
DUTIES_INTERVAL_SECONDS = 5.0
#: How often the sink sweeps for expired sessions (seconds): a policy counts in days, and each
#: sweep reads the settled sessions of the store.
SWEEP_INTERVAL_SECONDS = 60.0
#: Most sessions one sweep gives an erasure (one transaction); a full batch sweeps again at the next round.
SWEEP_BATCH = 500


def ledger_key(erasure: Erasure) -> bytes:
    """The ledger record's key: the fleet and the session id. The topic is compacted, so fleet A's
    erasure of X and fleet B's must not share a key (one would replace the other)."""
    return f"{erasure.fleet}\x00{erasure.session_id}".encode()


def publish_erasures(
    producer: Producer, settings: TurnlogSettings, ledger: Sequence[Erasure], timeout: float,
    signer: LedgerSigner | None = None,
) -> list[tuple[str, str]]:
    """Produce ``ledger`` to ``<prefix>.erasures``, on each session's partition (the ledger is
    co-partitioned with the transcript), signed by ``signer`` (None: unsigned, open mode; its
    ``requested_by`` is then given the issuer's prefix if it lacks it), and wait up to
    ``timeout`` seconds for the broker; the ``(session id, fleet)`` pairs it acknowledged (the
    others stay pending: the caller retries)."""
    acked: list[tuple[str, str]] = []
    topic = settings.topics.erasures
    for erasure in ledger:
        if signer is not None:
            erasure = msgspec.structs.replace(erasure, requested_by=signer.requested_by(erasure.requested_by))
        key, value = ledger_key(erasure), encode_erasure(erasure)
        headers: list[tuple[str, str | bytes | None]] | None = (
            list(signer.headers(key, value)) if signer is not None else None
        )
        pair = (erasure.session_id, erasure.fleet)

        def delivered(error: KafkaError | None, _message: Message, pair: tuple[str, str] = pair) -> None:
            if error is None:
                acked.append(pair)

        try:
            producer.produce(
                topic, key=key, value=value, headers=headers,
                partition=partition_for(erasure.session_id, settings.partitions), on_delivery=delivered,
            )
        except BufferError:
            break  # the local queue is full: what was queued is flushed below, the rest stays pending
    deadline = time.monotonic() + timeout
    while producer.flush(max(0.0, deadline - time.monotonic())) > 0 and time.monotonic() < deadline:
        pass
    return acked


def retention_cutoffs(
    settings: TurnlogSettings, now: dt.datetime
) -> tuple[dt.datetime | None, dict[str, dt.datetime]]:
    """``(default cutoff, {fleet: cutoff})``: a settled session that ended before its cutoff
    is past the retention policy (``retention_days``, ``retention_days_by_fleet``)."""
    default = None if settings.retention_days is None else now - dt.timedelta(days=settings.retention_days)
    by_fleet = {fleet: now - dt.timedelta(days=days) for fleet, days in settings.retention_days_by_fleet.items()}
    return default, by_fleet


class ErasureDuties:
    """The transcript sink's erasure work between batches (module docstring)."""

    def __init__(
        self, settings: TurnlogSettings, store: SqlStore, *, interval: float = DUTIES_INTERVAL_SECONDS,
        sweep_interval: float = SWEEP_INTERVAL_SECONDS,
    ) -> None:
        self.settings = settings
        self.store = store
        self.interval = interval
        self.sweep_interval = sweep_interval
        self._next_at = 0.0
        self._next_sweep_at = 0.0
        self._producer: Producer | None = None
        # ConfigurationError: a malformed key, or issuers set without a key they trust, refuses the start.
        self._signer = ledger_signer(settings)

    def warn_if_log_outlives_policy(self) -> list[LogOutlivesPolicy]:
        """Log a warning, with its fix, for each topic whose retention in the settings outlives
        the retention policy or the erasure deadline (``turnlog.kafka.log_retention``); the findings."""
        findings = log_outlives_policy(self.settings)
        for finding in findings:
            logger.warning("the log outlives the erasure policy: %s", finding)
        return findings

    def warn_if_unsigned(self) -> bool:
        """Log a warning if this sink's erasures go out unsigned and every reader takes any ledger
        record (no ``erasure_issuers``: open mode); whether it does."""
        if self._signer is not None:
            return False
        logger.warning(
            "TURNLOG_ERASURE_ISSUERS is empty: erasure ledger records are not signed, and every reader takes any "
            "record of %s (open mode; docs/security.md, 'Erasure issuers')", self.settings.topics.erasures,
        )
        return True

    def run_if_due(self) -> None:
        """Publish pending erasures if ``interval`` has passed, after a sweep for expired sessions
        if ``sweep_interval`` has (or the last sweep filled a batch). A store or broker outage is
        logged and left for the next round."""
        if time.monotonic() < self._next_at:
            return
        self._next_at = time.monotonic() + self.interval
        try:
            if time.monotonic() >= self._next_sweep_at:
                swept = self.sweep_retention()
                self._next_sweep_at = time.monotonic() + (self.interval if len(swept) >= SWEEP_BATCH
                                                          else self.sweep_interval)
            self.publish_pending()
        except StoreUnavailableError as e:
            logger.warning("erasure duties: the store is unavailable (%s); next round in %.0f s", e, self.interval)

    def sweep_retention(self, now: dt.datetime | None = None) -> list[str]:
        """Give the sessions past the retention policy (``SqlErasures.expired``) a pending erasure (``requested_by``
        and ``reason`` ``retention``), at most :data:`SWEEP_BATCH` in one transaction; the ids,
        oldest first (a full batch: call again for the rest)."""
        now = now or dt.datetime.now(dt.UTC)
        default, by_fleet = retention_cutoffs(self.settings, now)
        if default is None and not by_fleet:
            return []
        with store_errors(), self.store.engine.begin() as conn:
            expired = self.store.erasures.expired(conn, default, by_fleet, limit=SWEEP_BATCH)
            for session_id, fleet in expired:
                requested_by = self._signer.requested_by("retention") if self._signer is not None else "retention"
                self.store.erasures.request(conn, Erasure(
                    session_id=session_id, fleet=fleet, requested_by=requested_by, requested_at=now,
                    reason="retention",
                ))
        if expired:
            logger.info("retention: %d sessions past the policy, their erasure requested", len(expired))
        return [session_id for session_id, _ in expired]

    def publish_pending(self) -> int:
        """Publish the store's unpublished erasures; how many the broker acknowledged."""
        with store_errors(), self.store.engine.connect() as conn:
            pending = self.store.erasures.unpublished(conn)
        if not pending:
            return 0
        if self._producer is None:
            self._producer = kafka.producer(self.settings, client_id=f"{self.settings.sink_group}-erasures")
        acked = publish_erasures(self._producer, self.settings, pending, timeout=self.settings.ack_wait_seconds * 10,
                                 signer=self._signer)
        if acked:
            with store_errors(), self.store.engine.begin() as conn:
                self.store.erasures.mark_published(conn, acked, dt.datetime.now(dt.UTC))
        if len(acked) < len(pending):
            logger.warning("erasures: %d of %d pending ledger records not acknowledged yet (broker away?)",
                           len(pending) - len(acked), len(pending))
        return len(acked)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5.0)
            self._producer = None
