"""turnlog's one Kafka layer (docs/design.md, "One Kafka layer").

- one connection config from the ``TURNLOG_KAFKA_*`` settings
  (:func:`client_config`; Faust's side in ``turnlog.kafka.faust_auth``);
- the client factories every component uses (:func:`consumer`,
  :func:`producer`, :func:`admin`);
- one helper for committed offsets and watermarks with one retry policy
  (:class:`OffsetReader`);
- broker errors converted to turnlog's classes at this one boundary
  (:func:`broker_errors`, ``turnlog.kafka.exceptions``). Outside this package,
  nothing catches confluent-kafka's ``KafkaException``.
"""

from turnlog.kafka.client_errors import broker_errors, to_broker_error
from turnlog.kafka.clients import admin, consumer, produce, producer, producer_from_config
from turnlog.kafka.cluster import GroupMembers, broker_answers, group_members, wait_for_broker, while_unavailable
from turnlog.kafka.config import IDEMPOTENT_PRODUCER, client_config, consumer_config, producer_config
from turnlog.kafka.exceptions import (
    BrokerConfigurationError,
    BrokerError,
    BrokerUnavailableError,
    RecordRefusedError,
    TopicAlreadyExistsError,
    UnknownTopicError,
)
from turnlog.kafka.offsets import OffsetReader, Watermarks, lookup_retry
from turnlog.kafka.partitioning import partition_for

__all__ = [
    "partition_for",
    "client_config",
    "consumer_config",
    "producer_config",
    "IDEMPOTENT_PRODUCER",
    "consumer",
    "producer",
    "producer_from_config",
    "produce",
    "admin",
    "OffsetReader",
    "Watermarks",
    "lookup_retry",
    "broker_answers",
    "wait_for_broker",
    "while_unavailable",
    "GroupMembers",
    "group_members",
    "broker_errors",
    "to_broker_error",
    "BrokerError",
    "BrokerUnavailableError",
    "BrokerConfigurationError",
    "UnknownTopicError",
    "TopicAlreadyExistsError",
    "RecordRefusedError",
]
