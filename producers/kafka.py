"""A thin asyncio wrapper over confluent-kafka's idempotent producer.

No network I/O in the constructor; the caller's config is copied, never
mutated. A background thread serves delivery callbacks (``poll``), which
resolve asyncio futures on the caller's loop. ``close()`` flushes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from turnlog.faults import fault_point
from turnlog.producers.exceptions import DeliveryError

__all__ = ["AsyncProducer", "idempotent_config"]

logger = logging.getLogger(__name__)


def idempotent_config(bootstrap_servers: str, *, client_id: str, delivery_timeout_seconds: float) -> dict[str, Any]:
    """The producer settings DESIGN.md requires: idempotence, ``acks=all``,
    and the murmur2 partitioner (the Java client's, so both agree on partitions)."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "compression.type": "lz4",
        "delivery.timeout.ms": int(delivery_timeout_seconds * 1000),
    }


class AsyncProducer:
    """confluent-kafka ``Producer`` with futures for delivery reports.

    ``send()`` enqueues at once (no await between the caller's seq assignment
    and the enqueue, so per-partition order is the call order) and returns a
    future resolved with the delivered ``Message`` or failed with
    :class:`DeliveryError`.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = dict(config)
        self._producer: Producer | None = None
        self._poller: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        if self._producer is not None:
            return
        self._producer = Producer({**self._config, "error_cb": _log_client_error})
        self._stopping.clear()
        self._poller = threading.Thread(target=self._poll_forever, name="turnlog-producer-poll", daemon=True)
        self._poller.start()

    def _poll_forever(self) -> None:
        assert self._producer is not None
        while not self._stopping.is_set():
            self._producer.poll(0.05)

    def send(self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]] | None = None) -> asyncio.Future[Message]:
        """Enqueue one record; the future resolves when the broker acknowledges it (``acks=all``)."""
        if self._producer is None:
            raise RuntimeError("AsyncProducer.start() was not called")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Message] = loop.create_future()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            loop.call_soon_threadsafe(_settle, future, err, msg)

        while True:
            try:
                self._producer.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
                fault_point("producer.after_produce")
                return future
            except BufferError:
                # The local queue is full: let the poller drain delivery reports.
                self._producer.poll(0.1)
            except KafkaException as e:
                raise DeliveryError(f"produce to {topic} failed: {e}", e.args[0] if e.args else None) from e

    async def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for every queued record; returns how many are left."""
        if self._producer is None:
            return 0
        return await asyncio.get_running_loop().run_in_executor(None, self._producer.flush, timeout)

    async def close(self, timeout: float = 30.0) -> None:
        """Flush (up to ``timeout`` seconds) and stop the poll thread."""
        if self._producer is None:
            return
        left = await self.flush(timeout)
        if left:
            logger.warning("closing the producer with %d records not acknowledged", left)
        self._stopping.set()
        if self._poller is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._poller.join)
        self._producer = None


def _settle(future: asyncio.Future[Message], err: KafkaError | None, msg: Message) -> None:
    if future.done():
        return
    if err is not None:
        future.set_exception(DeliveryError(f"delivery to {msg.topic()} failed: {err.str()}", err))
    else:
        future.set_result(msg)


def _log_client_error(err: KafkaError) -> None:
    if err.fatal():
        logger.error("fatal producer error: %s", err.str())
    else:
        logger.warning("producer: %s", err.str())
