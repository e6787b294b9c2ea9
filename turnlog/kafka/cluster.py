"""Questions about the cluster itself: does a broker answer (or wait until one does), who is in a consumer group."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient
from tenacity import RetryCallState, Retrying, retry_if_result, wait_exponential

from turnlog.exceptions import ConfigurationError
from turnlog.kafka.clients import admin
from turnlog.kafka.errors import broker_errors
from turnlog.kafka.exceptions import BrokerError
from turnlog.redact import redact
from turnlog.settings import TurnlogSettings

__all__ = ["broker_answers", "wait_for_broker", "GroupMembers", "group_members"]

logger = logging.getLogger(__name__)


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
