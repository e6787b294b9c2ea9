"""Questions about the cluster itself: does a broker answer, who is in a consumer group."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

from turnlog.kafka.clients import admin
from turnlog.kafka.errors import broker_errors
from turnlog.kafka.exceptions import BrokerError
from turnlog.settings import TurnlogSettings

__all__ = ["broker_answers", "GroupMembers", "group_members"]


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
