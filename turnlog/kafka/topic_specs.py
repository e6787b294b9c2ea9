"""Every topic turnlog's pipeline uses, as the settings ask for it: names, partitions,
replication and configs (``topic_specs``). ``turnlog topics create`` and ``check``
(``turnlog.deploy.topics``) create and compare these; the Faust apps declare theirs
with the same configs (``turnlog.stream_processors.app.ReplicatedTopic``).

The topics: ``<prefix>.events``, ``<prefix>.transcript`` and ``<prefix>.dlq``
(``cleanup.policy=delete`` and their ``retention.ms``), and those the Faust apps
declare, named and configured as faust-streaming 0.15.3 makes them (its source,
``site-packages/faust``):

- a table's changelog, ``<app id>-<table name>-changelog`` (``Table._changelog_topic_name``),
  with the table's partitions and ``cleanup.policy=compact`` (``Table._changelog_compacting``,
  turned into the config by the aiokafka transport's ``_topic_config``), plus the table's
  ``extra_topic_configs``;
- the leader assignor's topic, ``<app id>-__assignor-__leader``
  (``LeaderAssignor._leader_topic_name``), 1 partition, no config of its own;
- nothing for the agents' source topics (not internal: the conductor declares only
  internal ones) and no reply topics (turnlog never ``ask``s an agent).

The sequencer (app id ``sequencer_group``) has the ``sequencer-state`` table and an
assignor topic; the finalizer (``finalizer_group``) only its assignor topic.
``tests/unit/test_topic_settings.py`` checks this list against what Faust itself declares.

``<prefix>.events``, ``<prefix>.transcript`` and the sequencer's changelog are
co-partitioned (same partition count, same murmur2 key hashing), so a session's
events, its ordered transcript and its state live on the same partition number.
Every topic gets the replication factor and ``min.insync.replicas`` of
``turnlog.kafka.replication``, and ``max.message.bytes``, explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka.admin import NewTopic

from turnlog.kafka.replication import Replication
from turnlog.settings import TurnlogSettings

__all__ = [
    "TopicSpec", "topic_specs", "explicit_topic_config", "FaustTopic", "faust_topics", "changelog_topic_name",
    "assignor_topic_name", "SEQUENCER_TABLE", "SEQUENCER_CHANGELOG_CONFIGS", "TOPIC_MAX_MESSAGE_BYTES",
]

#: ``max.message.bytes`` of every topic (a record batch, after compression): Kafka's default,
#: set explicitly so the topics do not follow a broker's other default. The recorder's events
#: (``MAX_EVENT_BYTES``) and every record the sequencer sends (its producer's
#: ``message.max.bytes``, before compression) fit with room for compression's framing.
TOPIC_MAX_MESSAGE_BYTES = 1_048_588
#: The sequencer's table of session states.
SEQUENCER_TABLE = "sequencer-state"
#: Segment roll of the sequencer's changelog (milliseconds).
CHANGELOG_SEGMENT_MS = 10 * 60 * 1000
#: The sequencer table's ``extra_topic_configs``: roll segments often so compaction keeps the
#: changelog (and so the restore at start-up) near one record per session.
SEQUENCER_CHANGELOG_CONFIGS: Mapping[str, str] = {
    "segment.ms": str(CHANGELOG_SEGMENT_MS), "min.cleanable.dirty.ratio": "0.1",
}


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic as the settings ask for it: ``config`` holds every topic config set explicitly;
    ``co_partitioned`` when its partition count must equal ``settings.partitions``."""

    topic: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str]
    co_partitioned: bool

    def new_topic(self) -> NewTopic:
        """The admin client's request to create it."""
        return NewTopic(self.topic, self.partitions, self.replication_factor, config=dict(self.config))


@dataclass(frozen=True, slots=True)
class FaustTopic:
    """One topic a Faust app declares: ``config`` is what Faust itself passes (no replication);
    ``co_partitioned`` when its partitions must equal the events topic's (a table's changelog)."""

    name: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)
    co_partitioned: bool = False


def changelog_topic_name(app_id: str, table: str) -> str:
    """Faust's name for the changelog of table ``table`` of app ``app_id``."""
    return f"{app_id}-{table}-changelog"


def assignor_topic_name(app_id: str) -> str:
    """Faust's name for the leader assignor's topic of app ``app_id``."""
    return f"{app_id}-__assignor-__leader"


def faust_topics(settings: TurnlogSettings) -> list[FaustTopic]:
    """The topics the sequencer's and the finalizer's Faust apps declare, in that order."""
    return [
        FaustTopic(
            changelog_topic_name(settings.sequencer_group, SEQUENCER_TABLE),
            settings.partitions,
            {"cleanup.policy": "compact", **SEQUENCER_CHANGELOG_CONFIGS},
            co_partitioned=True,
        ),
        FaustTopic(assignor_topic_name(settings.sequencer_group), 1),
        FaustTopic(assignor_topic_name(settings.finalizer_group), 1),
    ]


def explicit_topic_config(replication: Replication) -> dict[str, str]:
    """The configs every topic turnlog or Faust creates gets explicitly, whatever the broker's
    defaults: ``min.insync.replicas`` and ``max.message.bytes``."""
    return {**replication.topic_config(), "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)}


#: Longest a segment of a retention-bound topic stays open (ms): Kafka deletes a segment only once
#: its newest record is past retention.ms, so this bounds how long a record outlives it (the
#: broker's default log.roll.ms is 7 days; docs/design.md, "Encryption and erasure").
MAX_SEGMENT_MS = 24 * 3600 * 1000


def _segment(retention_ms: int) -> dict[str, str]:
    """``segment.ms`` of a topic with this ``retention.ms``: at most a day, at most the retention."""
    return {} if retention_ms < 0 else {"segment.ms": str(max(1, min(retention_ms, MAX_SEGMENT_MS)))}


def topic_specs(settings: TurnlogSettings, replication: Replication) -> list[TopicSpec]:
    """Every topic turnlog and its Faust apps use, with partitions and configs (retention in
    milliseconds): turnlog's four (events, transcript, DLQ, the erasure ledger), then Faust's
    (:func:`faust_topics`)."""
    topics = settings.topics
    explicit = explicit_topic_config(replication)
    retention = {
        topics.events: settings.events_retention_ms,
        topics.transcript: settings.transcript_retention_ms,
        topics.dlq: settings.dlq_retention_ms,
    }
    specs = [
        TopicSpec(
            name, settings.partitions, replication.replication_factor,
            {"cleanup.policy": "delete", "retention.ms": str(retention_ms), **_segment(retention_ms), **explicit},
            co_partitioned=name != topics.dlq,
        )
        for name, retention_ms in retention.items()
    ]
    # The erasure ledger: compacted and never deleted (its records are the proof every reader
    # checks), compacted within the erasure deadline, co-partitioned (key = session id).
    deadline_ms = int(settings.erasure_deadline_days * 24 * 3600 * 1000)
    specs.append(TopicSpec(
        topics.erasures, settings.partitions, replication.replication_factor,
        {"cleanup.policy": "compact", "max.compaction.lag.ms": str(deadline_ms), **explicit},
        co_partitioned=True,
    ))
    specs += [
        TopicSpec(topic.name, topic.partitions, replication.replication_factor, {**topic.config, **explicit},
                  co_partitioned=topic.co_partitioned)
        for topic in faust_topics(settings)
    ]
    return specs
