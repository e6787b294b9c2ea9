"""Questions about the cluster itself: does a broker answer (or wait until one does), who is in a consumer group."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient
from tenacity import RetryCallState, Retrying, retry_if_exception, retry_if_result, wait_exponential

from turnlog.exceptions import ConfigurationError
from turnlog.kafka.client_errors import broker_errors
from turnlog.kafka.clients import admin
from turnlog.kafka.exceptions import BrokerError
from turnlog.redact import redact
from turnlog.settings import TurnlogSettings

__all__ = ["broker_answers", "wait_for_broker", "while_unavailable", "GroupMembers", "group_members"]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


def broker_answers(settings: TurnlogSettings, timeout: float = 5.0, *, quiet: bool = False) -> bool:
    """True if a broker of ``settings`` answers a metadata request within ``timeout`` seconds.
    ``quiet`` keeps librdkafka's connection errors out of the log (a probe of a broker
    expected to be down)."""
    try:
        client = admin(settings, **({"log_level": 0} if quiet else {}))
        with broker_errors("metadata"):
            client.list_topics(timeout=timeout)
    except BrokerError:
        return False
    return True


def wait_for_broker(settings: TurnlogSettings, *, timeout: float | None = None) -> None:
    """Block until a broker answers, polling with capped backoff (forever when ``timeout`` is None).

    Raises:
        ConfigurationError: no broker answered within ``timeout`` seconds.
    """
    deadline = None if timeout is None else time.monotonic() + timeout

    def warn_once(state: RetryCallState) -> None:
        if state.attempt_number == 1:
            logger.warning("waiting for a Kafka broker at %s", redact(settings.bootstrap_servers))

    def gave_up(_: RetryCallState) -> None:
        raise ConfigurationError(f"no Kafka broker answers at {redact(settings.bootstrap_servers)}")

    retrying = Retrying(
        retry=retry_if_result(lambda answered: not answered),
        wait=wait_exponential(multiplier=0.5, max=5.0),
        stop=lambda _: deadline is not None and time.monotonic() >= deadline,
        before_sleep=warn_once,
        retry_error_callback=gave_up,
    )
    retrying(broker_answers, settings)


def while_unavailable(work: Callable[[], _T], what: str) -> _T:
    """``work()``, tried again with capped backoff, for as long as it raises a retriable
    :class:`BrokerError` (a failover, a controller quorum lost to nodes down): a service
    starting meanwhile waits it out rather than exit. Other errors pass through."""

    def warn(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        if state.attempt_number == 1 or state.attempt_number % 10 == 0:
            logger.warning("%s: the cluster is not answering (%s); trying again", what, error)

    retrying = Retrying(
        retry=retry_if_exception(lambda e: isinstance(e, BrokerError) and e.retriable),
        wait=wait_exponential(multiplier=0.5, max=5.0),
        before_sleep=warn,
        reraise=True,
    )
    return retrying(work)


@dataclass(frozen=True, slots=True)
class GroupMembers:
    """A consumer group as the broker describes it: ``stable`` (not rebalancing, not empty
    or dead) and its members' ids."""

    stable: bool
    member_ids: frozenset[str]


def group_members(client: AdminClient, group_id: str, timeout: float = 5.0) -> GroupMembers:
    """Describe consumer group ``group_id`` through ``client`` (from :func:`turnlog.kafka.admin`).

    Raises:
        BrokerError: the broker did not answer or refused.
    """
    with broker_errors(f"describing group {group_id}"):
        description = client.describe_consumer_groups([group_id], request_timeout=timeout)[group_id].result()
    return GroupMembers(
        stable=description.state == ConsumerGroupState.STABLE,
        member_ids=frozenset(member.member_id for member in description.members),
    )
