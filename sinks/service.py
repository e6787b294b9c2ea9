"""The sink service: consume ``<prefix>.transcript`` and apply batches to the store.

Per batch (at most ``sink_batch_size`` records, waiting at most
``sink_batch_wait_seconds``): one database transaction writes the rows and the
next offsets (``SqlStore.apply_batch``). Offsets are never committed to Kafka;
on partition assignment the consumer seeks to the offsets in ``sink_offsets``,
so a crash at any point replays only what the store does not hold yet.

A database outage is retried with capped exponential backoff (the same batch,
until it commits or the service is asked to stop); the consumer may leave the
group meanwhile, and on rejoining it seeks to the stored offsets again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from tenacity import RetryCallState, retry, retry_if_exception_type, wait_exponential

from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import BatchResult, SqlStore
from turnlog.sinks.batch import SourceMessage
from turnlog.sinks.errors import store_errors
from turnlog.sinks.exceptions import StoreUnavailableError

__all__ = ["SinkService"]

logger = logging.getLogger(__name__)


class SinkService:
    """Consumes the transcript topic in consumer group ``settings.sink_group``.

    ``on_batch`` (optional) is called after each committed batch with its result.
    """

    def __init__(
        self,
        settings: TurnlogSettings,
        store: SqlStore,
        *,
        consumer_config: Mapping[str, Any] | None = None,
        on_batch: Callable[[BatchResult], None] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self._config = {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": settings.sink_group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            **(consumer_config or {}),
        }
        self._on_batch = on_batch
        self.stopping = threading.Event()

    def run(self) -> None:
        """Consume and apply until :attr:`stopping` is set."""
        consumer = Consumer(dict(self._config))
        consumer.subscribe([self.settings.topics.transcript], on_assign=self._seek_to_stored)
        try:
            while not self.stopping.is_set():
                records = consumer.consume(self.settings.sink_batch_size, self.settings.sink_batch_wait_seconds)
                batch = []
                for record in records:
                    error = record.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            logger.warning("consumer: %s", error.str())
                        continue
                    batch.append(SourceMessage(record.topic(), record.partition(), record.offset(), record.value()))
                if batch:
                    result = self._apply_with_retries(batch)
                    if self._on_batch is not None:
                        self._on_batch(result)
        finally:
            consumer.close()

    def _seek_to_stored(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        stored = self._stored_offsets([(tp.topic, tp.partition) for tp in partitions])
        for tp in partitions:
            tp.offset = stored.get((tp.topic, tp.partition), OFFSET_BEGINNING)
        logger.info("assigned %s", ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in partitions))
        consumer.assign(partitions)

    @retry(
        retry=retry_if_exception_type(StoreUnavailableError),
        wait=wait_exponential(multiplier=0.2, max=5.0),
        stop=lambda state: _service_of(state).stopping.is_set(),
        before_sleep=lambda state: logger.warning(
            "store unavailable (attempt %d): %s", state.attempt_number, state.outcome.exception() if state.outcome else ""
        ),
        reraise=True,
    )
    def _stored_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        with store_errors():
            with self.store.engine.connect() as conn:
                return self.store.stored_offsets(conn, self.settings.sink_group, partitions)

    @retry(
        retry=retry_if_exception_type(StoreUnavailableError),
        wait=wait_exponential(multiplier=0.2, max=5.0),
        stop=lambda state: _service_of(state).stopping.is_set(),
        before_sleep=lambda state: logger.warning(
            "batch not written, retrying (attempt %d): %s",
            state.attempt_number,
            state.outcome.exception() if state.outcome else "",
        ),
        reraise=True,
    )
    def _apply_with_retries(self, batch: list[SourceMessage]) -> BatchResult:
        with store_errors():
            with self.store.engine.begin() as conn:
                return self.store.apply_batch(conn, self.settings.sink_group, batch)


def _service_of(state: RetryCallState) -> SinkService:
    # tenacity passes the bound method's arguments; ``self`` comes first.
    return state.args[0]
