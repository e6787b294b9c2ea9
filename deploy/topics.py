"""Create turnlog's topics explicitly (``turnlog topics create``), never by broker auto-creation.

``<prefix>.events`` and ``<prefix>.transcript`` are co-partitioned (same
partition count, same murmur2 key hashing), so a session's events and its
ordered transcript live on the same partition number.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future

from confluent_kafka.admin import AdminClient, NewTopic

from turnlog import kafka
from turnlog.exceptions import ConfigurationError
from turnlog.redact import redact
from turnlog.settings import TurnlogSettings

__all__ = ["topic_specs", "create_topics", "delete_topics_with_prefix", "TOPIC_MAX_MESSAGE_BYTES"]

logger = logging.getLogger(__name__)
#: ``max.message.bytes`` of every topic (a record batch, after compression): Kafka's default,
#: set explicitly so the topics do not follow a broker's other default. The recorder's events
#: (``MAX_EVENT_BYTES``) and every record the sequencer sends (its producer's
#: ``message.max.bytes``, before compression) fit with room for compression's framing.
TOPIC_MAX_MESSAGE_BYTES = 1_048_588


def topic_specs(settings: TurnlogSettings) -> list[NewTopic]:
    """The topics with their partitions and configs (retention in milliseconds)."""
    topics = settings.topics
    common = {
        "cleanup.policy": "delete", "min.insync.replicas": "1", "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES),
    }
    return [
        NewTopic(topics.events, settings.partitions, settings.replication_factor,
                 config={**common, "retention.ms": str(settings.events_retention_ms)}),
        NewTopic(topics.transcript, settings.partitions, settings.replication_factor,
                 config={**common, "retention.ms": str(settings.transcript_retention_ms)}),
        NewTopic(topics.dlq, settings.partitions, settings.replication_factor,
                 config={**common, "retention.ms": str(settings.dlq_retention_ms)}),
    ]


def create_topics(settings: TurnlogSettings, *, timeout: float = 30.0) -> list[str]:
    """Create the missing topics; returns the names created.

    Raises:
        ConfigurationError: no broker answers, an existing topic has another
            partition count than ``settings.partitions`` (co-partitioning would
            break), or the broker refused the request.
        BrokerError: the broker stopped answering while the topics' metadata was read.
    """
    admin = kafka.admin(settings)
    if not kafka.broker_answers(settings, min(timeout, 10.0)):
        raise ConfigurationError(
            f"no Kafka broker answers at {redact(settings.bootstrap_servers)} "
            "(start one with `bash deploy/services.sh start`)"
        )
    specs = topic_specs(settings)
    with kafka.broker_errors("create_topics"):
        futures = admin.create_topics(specs, request_timeout=timeout, operation_timeout=timeout)
    try:
        created = _settle(futures, "creating topic", "created topic", already=kafka.TopicAlreadyExistsError)
    except kafka.BrokerError as e:  # its message names the topic
        raise ConfigurationError(f"cannot create the topics: {e}") from e
    for spec in specs:
        partitions = _partition_count(admin, spec.topic, timeout)
        if partitions != settings.partitions:
            raise ConfigurationError(
                f"topic {spec.topic} has {partitions} partitions but TURNLOG_PARTITIONS is {settings.partitions}; "
                "co-partitioned topics must agree"
            )
    return created


def delete_topics_with_prefix(settings: TurnlogSettings, prefix: str, *, timeout: float = 30.0) -> list[str]:
    """Delete every topic named ``<prefix>.…`` or ``<prefix>-…``; returns the names deleted.

    For throwaway pipelines (tests, benchmarks) whose topic prefix and consumer
    groups share ``prefix``: Faust names its changelog and internal topics after
    the app id (the group), so those go too. A broker keeps every topic it holds
    until it is deleted, and a restarted broker loads them all (thousands of
    leftover partitions made restarts take minutes).

    Raises:
        BrokerError: the broker did not list the topics, or refused a deletion.
    """
    admin = kafka.admin(settings)  # held until the futures resolve: a collected client cancels them
    with kafka.broker_errors("listing topics"):
        names = sorted(name for name in admin.list_topics(timeout=timeout).topics
                       if name.startswith((f"{prefix}.", f"{prefix}-")))
    if not names:
        return []
    with kafka.broker_errors("delete_topics"):
        futures = admin.delete_topics(names, request_timeout=timeout, operation_timeout=timeout)
    _settle(futures, "deleting topic", "deleted topic", already=kafka.UnknownTopicError)  # unknown: deleted meanwhile
    return names


def _settle(
    futures: Mapping[str, Future[None]], doing: str, done: str, *, already: type[kafka.BrokerError]
) -> list[str]:
    """Wait for each topic's future of an admin request (``{topic: future}``, in order)
    and return the topics it changed, each logged as ``"<done> <topic>"``; one whose
    error is ``already`` (the topic was as asked before the request) is skipped.

    Raises:
        BrokerError: the broker refused the request for a topic (the message says
            ``"<doing> <topic>: ..."``).
    """
    changed = []
    for name, future in futures.items():
        try:
            with kafka.broker_errors(f"{doing} {name}"):
                future.result()
        except already:
            continue
        changed.append(name)
        logger.info("%s %s", done, name)
    return changed


def _partition_count(admin: AdminClient, topic: str, timeout: float) -> int:
    """The topic's partition count, polling until new metadata has propagated."""
    deadline = time.monotonic() + timeout
    while True:
        with kafka.broker_errors(f"metadata of {topic}"):
            found = admin.list_topics(topic=topic, timeout=timeout).topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return len(found.partitions)
        if time.monotonic() >= deadline:
            return 0
        time.sleep(0.2)
