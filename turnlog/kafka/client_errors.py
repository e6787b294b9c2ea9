"""The one boundary where confluent-kafka's errors become turnlog's own classes.

Decided by librdkafka error code and the error's own flags, never by message text.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError, KafkaException

from turnlog.kafka.exceptions import (
    BrokerConfigurationError,
    BrokerError,
    BrokerUnavailableError,
    RecordRefusedError,
    TopicAlreadyExistsError,
    UnknownTopicError,
)

__all__ = ["broker_errors", "to_broker_error", "UNAVAILABLE_CODES"]

# Conditions that pass (a coordinator moving or loading, a leader election, a
# broker restarting), on top of those librdkafka itself flags retriable.
UNAVAILABLE_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._WAIT_COORD,
        KafkaError._RESOLVE,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        # A replicated cluster's passing states: a leader moved (the client drops the handle of a
        # broker that left the metadata, or asked with an old leader epoch), or fewer replicas in
        # sync than min.insync.replicas for a while.
        KafkaError._DESTROY_BROKER,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        # A new leader answers this for offset lookups until its high watermark has caught up
        # with the followers' (KIP-207); librdkafka does not flag it retriable.
        KafkaError.OFFSET_NOT_AVAILABLE,
    }
)
# Bad client settings, TLS or SASL failures, and access the broker denies.
CONFIGURATION_CODES = frozenset(
    {
        KafkaError._INVALID_ARG,
        KafkaError._SSL,
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.UNSUPPORTED_SASL_MECHANISM,
        KafkaError.ILLEGAL_SASL_STATE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)
UNKNOWN_TOPIC_CODES = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                                 KafkaError._UNKNOWN_PARTITION})
RECORD_REFUSED_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD})


def to_broker_error(error: KafkaError | KafkaException, context: str = "") -> BrokerError:
    """The most specific :class:`BrokerError` for ``error`` (not raised; the caller raises
    it ``from`` the original). ``context`` prefixes the message, e.g. ``"committed offsets"``."""
    kafka_error = error.args[0] if isinstance(error, KafkaException) and error.args else error
    if not isinstance(kafka_error, KafkaError):  # a KafkaException carrying only text
        return BrokerError(f"{context}: {error}" if context else str(error))
    code = kafka_error.code()
    retriable = bool(kafka_error.retriable()) or code in UNAVAILABLE_CODES
    message = f"{context}: {kafka_error.str()}" if context else kafka_error.str()
    if code in CONFIGURATION_CODES:
        kind: type[BrokerError] = BrokerConfigurationError
    elif code in UNKNOWN_TOPIC_CODES:
        kind = UnknownTopicError
    elif code == KafkaError.TOPIC_ALREADY_EXISTS:
        kind = TopicAlreadyExistsError
    elif code in RECORD_REFUSED_CODES:
        kind = RecordRefusedError
    elif retriable:
        kind = BrokerUnavailableError
    else:
        kind = BrokerError
    return kind(message, code=code, retriable=retriable)


@contextmanager
def broker_errors(context: str = "") -> Iterator[None]:
    """Raise turnlog's :class:`BrokerError` subclasses for confluent-kafka's errors in the block.

    Raises:
        BrokerError: (a subclass of it) ``from`` the client's ``KafkaException``.
    """
    try:
        yield
    except KafkaException as e:
        raise to_broker_error(e, context) from e
