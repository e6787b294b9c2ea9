"""Topic settings on the local 3-node cluster: the default replication (RF 3, min ISR 2) on every
topic turnlog and Faust use; a topic of replication factor 1 reported as needing a reassignment,
its min ISR left until then; nothing changed while a node holding replicas is down."""

from __future__ import annotations

from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from turnlog import kafka
from turnlog.deploy.topics import Outcome, TopicDifference, check_topics, create_topics
from turnlog.kafka.replication import Replication, live_broker_count
from turnlog.kafka.topic_specs import MAX_SEGMENT_MS, TOPIC_MAX_MESSAGE_BYTES
from turnlog.settings import TurnlogSettings

from tests.support import wait_until


def _config(settings: TurnlogSettings, topic: str, name: str) -> str:
    admin = kafka.admin(settings)
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)], request_timeout=10).values()
    return str(future.result(timeout=30)[name].value)


def _replica_counts(settings: TurnlogSettings, topic: str) -> set[int]:
    """The replica counts of ``topic``'s partitions, once the broker asked lists them: a topic
    just created reaches each broker's metadata a moment after the controller made it."""

    def listed() -> set[int]:
        described = kafka.admin(settings).list_topics(topic=topic, timeout=10).topics.get(topic)
        return {len(p.replicas) for p in described.partitions.values()} if described is not None else set()

    return wait_until(listed, timeout=30, what=f"the partitions of {topic} in the metadata")


def test_by_default_every_topic_has_three_replicas_and_min_isr_two(kafka_cluster):
    settings = kafka_cluster.settings(replication_factor=None)
    result = create_topics(settings)
    assert result.replication == Replication(replication_factor=3, min_insync_replicas=2, live_brokers=3)
    assert len(result.created) == 7 and result.differences == ()  # turnlog's four, Faust's three
    for topic in result.created:
        assert _replica_counts(settings, topic) == {3}, topic
        assert _config(settings, topic, "min.insync.replicas") == "2", topic
    assert check_topics(settings).ok


def test_a_topic_with_one_replica_needs_a_reassignment_and_its_min_isr_waits_for_it(kafka_cluster):
    settings = kafka_cluster.settings()  # RF 3, min ISR 2 (the default for RF 3)
    events = settings.topics.events
    admin = kafka.admin(settings)
    as_asked_but_replication = {"cleanup.policy": "delete", "retention.ms": str(settings.events_retention_ms),
                                "segment.ms": str(min(settings.events_retention_ms, MAX_SEGMENT_MS)),
                                "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES), "min.insync.replicas": "1"}
    admin.create_topics([NewTopic(events, settings.partitions, 1, config=as_asked_but_replication)])[
        events
    ].result(timeout=30)

    created = create_topics(settings)
    expected = [
        TopicDifference(events, "replication factor", "1", "3", Outcome.NEEDS_REASSIGNMENT),
        TopicDifference(events, "min.insync.replicas", "1", "2", Outcome.AFTER_REASSIGNMENT,
                        "2 in-sync replicas of 1 would stop writes"),
    ]
    assert list(created.differences) == expected

    checked = check_topics(settings)
    assert list(checked.differences) == expected and not checked.ok
    assert _config(settings, events, "min.insync.replicas") == "1"  # writes still go through
    assert [str(d) for d in checked.differences][0] == (
        f"{events}: replication factor is 1, wanted 3: needs a partition reassignment (kafka-reassign-partitions.sh)"
    )


def test_nothing_is_changed_while_a_node_holding_replicas_is_down(kafka_cluster):
    settings = kafka_cluster.settings(replication_factor=None)
    create_topics(settings)
    dlq = settings.topics.dlq
    admin = kafka.admin(settings)
    wrong = ConfigResource(ResourceType.TOPIC, dlq, incremental_configs=[
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)
    ])
    for future in admin.incremental_alter_configs([wrong]).values():
        future.result(timeout=30)

    kafka_cluster.kill(3)
    wait_until(lambda: live_broker_count(settings) == 2, timeout=60, what="node 3 gone from the metadata")
    checked = check_topics(settings)
    assert checked.offline_brokers == {3} and not checked.ok
    assert checked.replication == Replication(replication_factor=2, min_insync_replicas=1, live_brokers=2)
    assert Outcome.FIXED not in {d.outcome for d in checked.differences}
    assert {(d.topic, d.setting): d.outcome for d in checked.differences}[(dlq, "retention.ms")] is Outcome.HELD
    assert _config(settings, dlq, "retention.ms") == "3600000"
    assert _config(settings, dlq, "min.insync.replicas") == "2"  # not lowered to the partial cluster's 1

