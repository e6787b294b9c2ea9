"""Create and check turnlog's topics and its Faust apps' (``turnlog topics create``,
``turnlog topics check``), never by broker auto-creation.

What each topic should be (names, partitions, replication, configs) is
``turnlog.kafka.topic_specs``; the replication follows ``turnlog.kafka.replication``.
Creating never changes an existing topic: it reports how it differs. Checking
compares every setting a spec sets and fixes what a config change can fix;
the replication factor needs a partition reassignment, and the partition count
of a co-partitioned topic cannot change without moving sessions.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
    TopicMetadata,
)

from turnlog import kafka
from turnlog.exceptions import ConfigurationError
from turnlog.kafka.log_retention import LogOutlivesPolicy, log_outlives_policy
from turnlog.kafka.replication import Replication, replication_for
from turnlog.kafka.topic_specs import TOPIC_MAX_MESSAGE_BYTES, TopicSpec, topic_specs
from turnlog.redact import redact
from turnlog.settings import TurnlogSettings

__all__ = [
    "create_topics", "CreatedTopics", "check_topics", "TopicCheck", "TopicDifference", "Outcome", "DescribedTopic",
    "topic_differences", "delete_topics_with_prefix", "TopicSpec", "topic_specs", "TOPIC_MAX_MESSAGE_BYTES",
]

logger = logging.getLogger(__name__)
#: Configs whose value is a comma-separated list in any order.
_LIST_CONFIGS = frozenset({"cleanup.policy"})


class Outcome(enum.Enum):
    """What became of a difference; ``value`` is how a report says it."""

    FIXED = "fixed"
    WOULD_FIX = "fixable by a config change (not changed)"
    FIX_FAILED = "not fixed: the broker refused the change"
    HELD = "not fixed while brokers holding replicas are down"
    AFTER_REASSIGNMENT = "not fixed until the replication factor is"
    NEEDS_REASSIGNMENT = "needs a partition reassignment (kafka-reassign-partitions.sh)"
    CANNOT_FIX = "cannot be fixed"
    MISSING = "missing: run `turnlog topics create`"


@dataclass(frozen=True, slots=True)
class TopicDifference:
    """One setting of one existing topic that is not what the settings ask: ``setting`` is
    ``"partitions"``, ``"replication factor"`` or a topic config name (``"topic"`` for a
    missing topic); ``found`` and ``wanted`` as the broker and the settings say them;
    ``detail`` says why it was not fixed, when that needs saying."""

    topic: str
    setting: str
    found: str
    wanted: str
    outcome: Outcome
    detail: str = ""

    @property
    def resolved(self) -> bool:
        """True when the topic now has what the settings ask."""
        return self.outcome is Outcome.FIXED

    def __str__(self) -> str:
        if self.outcome is Outcome.MISSING:
            return f"{self.topic}: {self.outcome.value}"
        line = f"{self.topic}: {self.setting} is {self.found}, wanted {self.wanted}: {self.outcome.value}"
        return f"{line} ({self.detail})" if self.detail else line


@dataclass(frozen=True, slots=True)
class CreatedTopics:
    """What ``create_topics`` did: the topics it created, those that existed, and how those
    differ from the settings (outcomes as in a dry run of :func:`check_topics`)."""

    replication: Replication
    specs: tuple[TopicSpec, ...]
    created: tuple[str, ...]
    existing: tuple[str, ...]
    differences: tuple[TopicDifference, ...]


@dataclass(frozen=True, slots=True)
class TopicCheck:
    """What ``check_topics`` found and did. ``offline_brokers`` hold replicas of the topics
    but do not answer; nothing is changed while there are any. ``log_retention``: the topics
    whose retention (in the settings, or on the broker after the fixes) outlives the store's
    retention policy or the erasure deadline (``turnlog.kafka.log_retention``); warnings, they
    do not make the check fail."""

    replication: Replication
    topics: tuple[str, ...]
    differences: tuple[TopicDifference, ...]
    offline_brokers: frozenset[int] = field(default_factory=frozenset)
    log_retention: tuple[LogOutlivesPolicy, ...] = ()

    @property
    def ok(self) -> bool:
        """True when every topic is as the settings ask (after the fixes)."""
        return not self.offline_brokers and all(difference.resolved for difference in self.differences)


@dataclass(frozen=True, slots=True)
class DescribedTopic:
    """An existing topic as the broker describes it: its partition count, the replica counts of
    its partitions (one value when they agree), the brokers its replicas are on (node ids), and
    its configs (name to value, defaults included)."""

    partitions: int
    replica_counts: frozenset[int]
    replica_brokers: frozenset[int]
    config: Mapping[str, str | None]


def create_topics(settings: TurnlogSettings, *, timeout: float = 30.0, log_differences: bool = True) -> CreatedTopics:
    """Create the missing topics (turnlog's and its Faust apps'), each with the replication
    resolved from the live brokers (``turnlog.kafka.replication``); report how the existing
    ones differ from the settings (with ``log_differences``, each also as a warning; nothing
    is changed: :func:`check_topics` does that). Everything is checked before anything is
    created. When every topic exists, a replication factor above the live brokers is not
    refused (a worker restarting during a broker's outage creates nothing), only reported.

    Raises:
        ConfigurationError: no broker answers; the replication settings are inconsistent,
            or ask for more replicas than there are live brokers while a topic is missing;
            an existing co-partitioned topic has another partition count than
            ``settings.partitions`` (co-partitioning would break); or the broker refused
            to create a topic.
        BrokerError: the broker stopped answering while the topics were described.
    """
    admin = _admin_answering(settings, timeout)
    with kafka.broker_errors("cluster metadata"):
        metadata = admin.list_topics(timeout=timeout)
    replication = replication_for(settings, len(metadata.brokers))
    specs = topic_specs(settings, replication)
    existing = [spec for spec in specs if spec.topic in metadata.topics]
    missing = [spec for spec in specs if spec.topic not in metadata.topics]
    differences = _existing_differences(admin, metadata.topics, existing, specs, timeout)
    created: list[str] = []
    if missing:
        replication.require_enough_brokers()
        with kafka.broker_errors("create_topics"):
            futures = admin.create_topics([spec.new_topic() for spec in missing], request_timeout=timeout,
                                          operation_timeout=timeout)
        try:
            created = _await_topic_changes(futures, "creating topic", "created topic",
                                           already=kafka.TopicAlreadyExistsError)
        except kafka.BrokerError as e:  # its message names the topic
            raise ConfigurationError(f"cannot create the topics: {e}") from e
        # A topic the answering broker did not list yet (its metadata lags the controller's)
        # already existed: it is compared like the others.
        preexisting = [spec for spec in missing if spec.topic not in created]
        _wait_until_listed(admin, created + [spec.topic for spec in preexisting], timeout)
        if preexisting:
            with kafka.broker_errors("cluster metadata"):
                listed = admin.list_topics(timeout=timeout).topics
            differences += _existing_differences(admin, listed, preexisting, specs, timeout)
    for difference in differences if log_differences else ():
        logger.warning("topic settings differ: %s (`turnlog topics check` fixes what a config change can)",
                       difference)
    return CreatedTopics(
        replication=replication,
        specs=tuple(specs),
        created=tuple(created),
        existing=tuple(spec.topic for spec in specs if spec.topic not in created),
        differences=tuple(differences),
    )


def check_topics(settings: TurnlogSettings, *, fix: bool = True, timeout: float = 30.0) -> TopicCheck:
    """Compare every topic of :func:`topic_specs` with what the broker holds (the partition
    count, the replication factor and each config the spec sets), and with ``fix`` change
    the configs that differ (``incremental_alter_configs``, one request per topic). A
    ``min.insync.replicas`` the topic has too few replicas for is left until its
    replication factor is reassigned (it would refuse every write); nothing is changed
    while a broker holding a replica of the topics does not answer (the default
    replication follows the live brokers: it would be lowered).

    Raises:
        ConfigurationError: no broker answers, or the replication settings are inconsistent
            or ask for more replicas than there are live brokers.
        BrokerError: the broker stopped answering while the topics were described.
    """
    admin = _admin_answering(settings, timeout)
    with kafka.broker_errors("cluster metadata"):
        metadata = admin.list_topics(timeout=timeout)
    live = frozenset(metadata.brokers)
    replication = replication_for(settings, len(live))
    replication.require_enough_brokers()
    specs = topic_specs(settings, replication)
    found = _describe(admin, metadata.topics, [spec.topic for spec in specs if spec.topic in metadata.topics],
                      timeout)
    offline = frozenset[int]().union(*(topic.replica_brokers for topic in found.values())) - live
    differences: list[TopicDifference] = []
    for spec in specs:
        planned = topic_differences(spec, found.get(spec.topic), fix=fix)
        if offline:
            planned = [_held(difference) for difference in planned]
        elif fix:
            planned = _apply(admin, spec.topic, planned, timeout)
        differences += planned
    return TopicCheck(replication, tuple(spec.topic for spec in specs), tuple(differences), offline,
                      tuple(log_outlives_policy(settings, _retention_after(found, differences))))


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
    # An unknown topic was deleted meanwhile.
    _await_topic_changes(futures, "deleting topic", "deleted topic", already=kafka.UnknownTopicError)
    return names


def _existing_differences(
    admin: AdminClient, metadata: Mapping[str, TopicMetadata], existing: Sequence[TopicSpec],
    specs: Sequence[TopicSpec], timeout: float,
) -> list[TopicDifference]:
    """How each of the ``existing`` topics differs from its spec (a dry run's outcomes).

    Raises:
        ConfigurationError: a topic co-partitioned with others (among ``specs``) has another
            partition count than its spec.
        BrokerError: the broker did not answer, or refused to describe a topic.
    """
    found = _describe(admin, metadata, [spec.topic for spec in existing], timeout)
    differences = [
        difference
        for spec in existing
        for difference in topic_differences(spec, found.get(spec.topic), fix=False)
    ]
    for difference in differences:
        if difference.setting == "partitions" and difference.outcome is Outcome.CANNOT_FIX and _co_partitioned(
            specs, difference.topic
        ):
            raise ConfigurationError(
                f"topic {difference.topic} has {difference.found} partitions but TURNLOG_PARTITIONS is "
                f"{difference.wanted}; co-partitioned topics must agree"
            )
    return differences


def _admin_answering(settings: TurnlogSettings, timeout: float) -> AdminClient:
    """An admin client of ``settings``' cluster, once a broker answered.

    Raises:
        ConfigurationError: no broker answers within ``min(timeout, 10)`` seconds.
    """
    if not kafka.broker_answers(settings, min(timeout, 10.0)):
        raise ConfigurationError(
            f"no Kafka broker answers at {redact(settings.bootstrap_servers)} "
            "(start one with `bash deploy/services.sh start`)"
        )
    return kafka.admin(settings)


def topic_differences(
    spec: TopicSpec, found: DescribedTopic | None, *, fix: bool
) -> list[TopicDifference]:
    """How ``found`` (None: the topic does not exist) differs from ``spec``, each with the
    outcome a fix would have (``fix`` False: a dry run's outcomes): a config becomes
    :attr:`Outcome.FIXED`, except a ``min.insync.replicas`` above the topic's fewest replicas
    less one (:attr:`Outcome.AFTER_REASSIGNMENT`: it would stop writes, or stop them with one
    replica down); the replication factor needs a reassignment; a partition count cannot be
    fixed here. Nothing is sent to the broker."""
    if found is None:
        return [TopicDifference(spec.topic, "topic", "missing", "present", Outcome.MISSING)]
    differences = []
    if found.partitions != spec.partitions:
        why = ("co-partitioned with the events topic: its sessions would move to other partitions"
               if spec.co_partitioned else "not by a config change; kafka-topics.sh --alter --partitions only adds")
        differences.append(TopicDifference(spec.topic, "partitions", str(found.partitions), str(spec.partitions),
                                           Outcome.CANNOT_FIX, why))
    if found.replica_counts != {spec.replication_factor}:
        differences.append(TopicDifference(spec.topic, "replication factor", _counts(found.replica_counts),
                                           str(spec.replication_factor), Outcome.NEEDS_REASSIGNMENT))
    fewest_replicas = min(found.replica_counts, default=0)
    for name, wanted in spec.config.items():
        value = found.config.get(name)
        if _same_config(name, value, wanted):
            continue
        outcome = Outcome.FIXED if fix else Outcome.WOULD_FIX
        detail = ""
        if name == "min.insync.replicas" and int(wanted) > max(1, fewest_replicas - 1):
            outcome = Outcome.AFTER_REASSIGNMENT
            detail = f"{wanted} in-sync replicas of {fewest_replicas} would stop writes"
        differences.append(TopicDifference(spec.topic, name, "unset" if value is None else value, wanted, outcome,
                                           detail))
    return differences


def _held(difference: TopicDifference) -> TopicDifference:
    """``difference`` as a check that changes nothing reports it while brokers are down."""
    if difference.outcome in (Outcome.FIXED, Outcome.WOULD_FIX):
        return TopicDifference(difference.topic, difference.setting, difference.found, difference.wanted,
                               Outcome.HELD, difference.detail)
    return difference


def _apply(admin: AdminClient, topic: str, differences: list[TopicDifference], timeout: float) -> list[TopicDifference]:
    """Set the configs of ``differences`` marked :attr:`Outcome.FIXED` on ``topic`` in one
    incremental request; if the broker refuses it, they become :attr:`Outcome.FIX_FAILED`."""
    changes = [d for d in differences if d.outcome is Outcome.FIXED]
    if not changes:
        return differences
    resource = ConfigResource(
        ResourceType.TOPIC, topic,
        incremental_configs=[ConfigEntry(d.setting, d.wanted, incremental_operation=AlterConfigOpType.SET)
                             for d in changes],
    )
    try:
        with kafka.broker_errors("altering configs"):
            futures = admin.incremental_alter_configs([resource], request_timeout=timeout)
        with kafka.broker_errors(f"altering the configs of {topic}"):
            for future in futures.values():
                future.result()
    except kafka.BrokerError as e:
        logger.error("%s", e)
        return [
            TopicDifference(d.topic, d.setting, d.found, d.wanted, Outcome.FIX_FAILED, str(e))
            if d.outcome is Outcome.FIXED else d
            for d in differences
        ]
    for change in changes:
        logger.info("set %s=%s on topic %s (was %s)", change.setting, change.wanted, topic, change.found)
    return differences


#: How long a listed topic the broker does not know yet is asked again before it counts as deleted.
UNKNOWN_TOPIC_PATIENCE_SECONDS = 5.0


def _describe(
    admin: AdminClient, metadata: Mapping[str, TopicMetadata], topics: Sequence[str], timeout: float
) -> dict[str, DescribedTopic]:
    """The existing ``topics`` as the broker describes them: their partitions from ``metadata``
    (the cluster's, from ``list_topics``), their configs asked now. A topic the broker answers
    UNKNOWN_TOPIC_OR_PART for is asked again for up to ``UNKNOWN_TOPIC_PATIENCE_SECONDS`` (a
    broker applies a new topic's metadata a moment after it is listed elsewhere), then left out
    (deleted meanwhile).

    Raises:
        BrokerError: the broker did not answer, or refused to describe a topic.
    """
    if not topics:
        return {}
    configs: dict[str, dict[str, str | None]] = {}
    asked = list(topics)
    deadline = time.monotonic() + min(timeout, UNKNOWN_TOPIC_PATIENCE_SECONDS)
    while asked:
        with kafka.broker_errors("describing topic configs"):
            futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name) for name in asked],
                                             request_timeout=timeout)
        unknown = []
        for resource, future in futures.items():
            try:
                with kafka.broker_errors(f"describing the configs of {resource.name}"):
                    entries: Mapping[str, Any] = future.result()
            except kafka.UnknownTopicError:
                unknown.append(resource.name)
                continue
            configs[resource.name] = {name: entry.value for name, entry in entries.items()}
        # Listed but unknown: created a moment ago (the answering broker has not applied the
        # topic's metadata yet) or deleted meanwhile; asked again until the patience runs out.
        if not unknown or time.monotonic() >= deadline:
            break
        asked = unknown
        time.sleep(0.2)
    found = {}
    for name in topics:
        described = metadata.get(name)
        if described is None or name not in configs:
            continue
        partitions = described.partitions.values()
        found[name] = DescribedTopic(
            partitions=len(partitions),
            replica_counts=frozenset(len(partition.replicas) for partition in partitions),
            replica_brokers=frozenset(broker for partition in partitions for broker in partition.replicas),
            config=configs[name],
        )
    return found


def _retention_after(
    found: Mapping[str, DescribedTopic], differences: Iterable[TopicDifference]
) -> dict[str, int]:
    """Each described topic's ``retention.ms`` on the broker once the check is done: the value
    set when its difference was fixed, else the one described (an unreadable value is left out)."""
    retention = {topic: described.config.get("retention.ms") for topic, described in found.items()}
    for difference in differences:
        if difference.setting == "retention.ms" and difference.resolved:
            retention[difference.topic] = difference.wanted
    parsed: dict[str, int] = {}
    for topic, value in retention.items():
        if value is not None and value.strip().lstrip("-").isdigit():
            parsed[topic] = int(value)
    return parsed


def _co_partitioned(specs: Iterable[TopicSpec], topic: str) -> bool:
    return any(spec.co_partitioned for spec in specs if spec.topic == topic)


def _same_config(name: str, found: str | None, wanted: str) -> bool:
    if found is None:
        return False
    if name in _LIST_CONFIGS:
        return {part.strip() for part in found.split(",")} == {part.strip() for part in wanted.split(",")}
    return found.strip() == wanted.strip()


def _counts(counts: Iterable[int]) -> str:
    """Replica counts as a report says them: ``"3"``, or ``"2-3"`` when partitions differ."""
    ordered = sorted(counts)
    if not ordered:
        return "0"
    return str(ordered[0]) if ordered[0] == ordered[-1] else f"{ordered[0]}-{ordered[-1]}"


def _wait_until_listed(admin: AdminClient, topics: Sequence[str], timeout: float) -> None:
    """Poll until every one of ``topics`` (just created) is in the metadata with its partitions.

    Raises:
        ConfigurationError: one is not there after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    waiting = set(topics)
    while waiting:
        with kafka.broker_errors("topic metadata"):
            listed = admin.list_topics(timeout=timeout).topics
        waiting = {name for name in waiting
                   if name not in listed or listed[name].error is not None or not listed[name].partitions}
        if not waiting:
            return
        if time.monotonic() >= deadline:
            raise ConfigurationError(f"topics created but not in the cluster's metadata after {timeout:g} s: "
                                     f"{', '.join(sorted(waiting))}")
        time.sleep(0.2)


def _await_topic_changes(
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
