"""Topic settings without a broker: the replication rule (``turnlog.kafka.replication``), the
topics and configs asked for (``turnlog.kafka.topic_specs``, checked against what Faust itself
declares), how a described topic differs (``turnlog.deploy.topics.topic_differences``), the
topics Faust declares getting the replication (``ReplicatedTopic``), and when
``ensure_local_services`` starts the local broker."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka import errors as aiokafka_errors
from pydantic import ValidationError

from turnlog.deploy import local
from turnlog.deploy.topics import DescribedTopic, Outcome, TopicDifference, topic_differences
from turnlog.exceptions import ConfigurationError
from turnlog.kafka.replication import Replication, replication_for
from turnlog.kafka.topic_specs import TOPIC_MAX_MESSAGE_BYTES, TopicSpec, faust_topics, topic_specs
from turnlog.settings import TurnlogSettings, load_settings
from turnlog.stream_processors.app import configure_replication, make_app
from turnlog.stream_processors.finalizer import build_finalizer
from turnlog.stream_processors.sequencer import build_sequencer

THREE = Replication(replication_factor=3, min_insync_replicas=2, live_brokers=3)


# -- the replication rule -------------------------------------------------------------------------
@pytest.mark.parametrize(("live", "factor", "min_insync"), [(1, 1, 1), (2, 2, 1), (3, 3, 2), (5, 3, 2)])
def test_by_default_the_factor_is_at_most_three_and_min_isr_one_less(live: int, factor: int, min_insync: int):
    assert replication_for(TurnlogSettings(), live) == Replication(factor, min_insync, live)


def test_explicit_values_win_over_the_defaults():
    assert replication_for(TurnlogSettings(replication_factor=2), 3) == Replication(2, 1, 3)
    assert replication_for(TurnlogSettings(min_insync_replicas=1), 3) == Replication(3, 1, 3)
    assert replication_for(TurnlogSettings(replication_factor=1, min_insync_replicas=1), 1) == Replication(1, 1, 1)


def test_the_replication_factor_setting_still_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TURNLOG_REPLICATION_FACTOR", "2")
    monkeypatch.setenv("TURNLOG_MIN_INSYNC_REPLICAS", "1")
    settings = load_settings()
    assert (settings.replication_factor, settings.min_insync_replicas) == (2, 1)
    assert settings.as_environment()["TURNLOG_REPLICATION_FACTOR"] == "2"


def test_unset_replication_stays_unset_through_a_child_process_environment():
    assert "TURNLOG_REPLICATION_FACTOR" not in TurnlogSettings().as_environment()


@pytest.mark.parametrize("name", ["replication_factor", "min_insync_replicas"])
def test_a_replication_below_one_is_refused_at_load(name: str):
    with pytest.raises(ValidationError, match=name):
        TurnlogSettings(**{name: 0})


def test_min_isr_equal_to_the_factor_is_refused_naming_both_values_and_the_brokers():
    with pytest.raises(ConfigurationError) as refused:
        replication_for(TurnlogSettings(min_insync_replicas=3), 3)
    message = str(refused.value)
    assert "min.insync.replicas 3" in message and "replication factor 3" in message
    assert "3 live broker(s)" in message and "use at most 2" in message


def test_min_isr_above_the_factor_is_refused_even_for_a_factor_of_one():
    with pytest.raises(ConfigurationError, match=r"min.insync.replicas 2 .* replication factor 1 .*1 live broker"):
        replication_for(TurnlogSettings(min_insync_replicas=2), 1)
    with pytest.raises(ConfigurationError, match="replication factor 2"):
        replication_for(TurnlogSettings(replication_factor=2, min_insync_replicas=3), 5)


def test_a_factor_above_the_live_brokers_is_resolved_but_refused_for_creating():
    replication = replication_for(TurnlogSettings(replication_factor=3), 1)
    assert replication == Replication(3, 2, 1)
    with pytest.raises(ConfigurationError, match=r"replication factor 3 .* more than the 1 live broker"):
        replication.require_enough_brokers()
    THREE.require_enough_brokers()  # as many as brokers: fine


def test_no_live_broker_and_no_explicit_factor_is_refused():
    with pytest.raises(ConfigurationError, match="no live broker"):
        replication_for(TurnlogSettings(), 0)


# -- the topics asked for ---------------------------------------------------------------------------
def _settings(**overrides: Any) -> TurnlogSettings:
    return TurnlogSettings(topic_prefix="p", sequencer_group="p-seq", finalizer_group="p-fin", partitions=4,
                           **overrides)


def test_every_topic_gets_the_replication_and_the_record_limit_explicitly():
    specs = topic_specs(_settings(), THREE)
    assert [spec.topic for spec in specs] == [
        "p.events", "p.transcript", "p.dlq", "p.erasures", "p-seq-sequencer-state-changelog",
        "p-seq-__assignor-__leader", "p-fin-__assignor-__leader",
    ]
    for spec in specs:
        assert spec.replication_factor == 3, spec.topic
        assert spec.config["min.insync.replicas"] == "2", spec.topic
        assert spec.config["max.message.bytes"] == str(TOPIC_MAX_MESSAGE_BYTES), spec.topic
    assert [spec.topic for spec in specs if spec.co_partitioned] == [
        "p.events", "p.transcript", "p.erasures", "p-seq-sequencer-state-changelog"
    ]


def test_turnlogs_topics_have_their_retention_and_faust_s_changelog_is_compacted():
    settings = _settings(events_retention_ms=1000, transcript_retention_ms=2000, dlq_retention_ms=3000)
    specs = {spec.topic: spec for spec in topic_specs(settings, THREE)}
    assert [specs[f"p.{name}"].config["retention.ms"] for name in ("events", "transcript", "dlq")] == [
        "1000", "2000", "3000"
    ]
    # A segment is deleted once its newest record is past retention: segments roll daily at most.
    assert [specs[f"p.{name}"].config["segment.ms"] for name in ("events", "transcript", "dlq")] == [
        "1000", "2000", "3000"
    ]
    forever = {spec.topic: spec for spec in topic_specs(_settings(events_retention_ms=-1), THREE)}
    assert "segment.ms" not in forever["p.events"].config
    assert forever["p.transcript"].config["segment.ms"] == str(24 * 3600 * 1000)
    ledger = specs["p.erasures"].config  # never deleted; compacted within the erasure deadline
    assert (ledger["cleanup.policy"], ledger["max.compaction.lag.ms"], "retention.ms" in ledger) == (
        "compact", str(30 * 24 * 3600 * 1000), False
    )
    assert {specs[f"p.{name}"].config["cleanup.policy"] for name in ("events", "transcript", "dlq")} == {"delete"}
    changelog = specs["p-seq-sequencer-state-changelog"]
    assert changelog.partitions == 4 and changelog.config["cleanup.policy"] == "compact"
    assert "retention.ms" not in changelog.config
    assert specs["p-fin-__assignor-__leader"].partitions == 1


def _declared_by_faust(app: faust.App) -> dict[str, tuple[int, dict[str, Any]]]:
    """What Faust declares for ``app``: each topic's name, partitions and the configs Faust's
    aiokafka transport sends (its cleanup policy and retention, then the topic's own config)."""
    topics = [table.changelog_topic for table in app.tables.values()]
    topics.append(app._leader_assignor._leader_topic)
    assert not any(agent.channel.internal for agent in app.agents.values())  # the conductor declares internal ones only
    declared = {}
    for topic in topics:
        assert topic.internal
        config = {**app.transport._topic_config(topic.retention, topic.compacting, topic.deleting), **topic.config}
        declared[topic.get_topic_name()] = (topic.partitions or app.conf.topic_partitions, config)
    return declared


async def test_faust_s_topics_are_named_and_configured_as_faust_declares_them(tmp_path: Path):
    settings = _settings(faust_data_dir=str(tmp_path), insecure_open_fleets=True)
    declared = {**_declared_by_faust(build_sequencer(settings)), **_declared_by_faust(build_finalizer(settings))}
    assert declared == {topic.name: (topic.partitions, dict(topic.config)) for topic in faust_topics(settings)}


# -- how a topic differs --------------------------------------------------------------------------
SPEC = TopicSpec("p.events", 4, 3, {"cleanup.policy": "delete", "retention.ms": "1000", "min.insync.replicas": "2",
                                    "max.message.bytes": "1048588"}, co_partitioned=True)
AS_ASKED = {"cleanup.policy": "delete", "retention.ms": "1000", "min.insync.replicas": "2", "max.message.bytes": "1048588"}


def _described(partitions: int = 4, replicas: int = 3, **config: str) -> DescribedTopic:
    return DescribedTopic(partitions, frozenset({replicas}), frozenset(range(1, replicas + 1)),
                          {**AS_ASKED, **{name.replace("_", "."): value for name, value in config.items()}})


def test_a_topic_as_asked_has_no_difference():
    assert topic_differences(SPEC, _described(), fix=True) == []


def test_config_differences_are_fixed_or_reported_in_a_dry_run():
    found = _described(retention_ms="5", cleanup_policy="compact")
    assert topic_differences(SPEC, found, fix=True) == [
        TopicDifference("p.events", "cleanup.policy", "compact", "delete", Outcome.FIXED),
        TopicDifference("p.events", "retention.ms", "5", "1000", Outcome.FIXED),
    ]
    assert {d.outcome for d in topic_differences(SPEC, found, fix=False)} == {Outcome.WOULD_FIX}


def test_a_cleanup_policy_in_another_order_is_the_same():
    spec = TopicSpec("t", 1, 1, {"cleanup.policy": "compact,delete"}, co_partitioned=False)
    assert topic_differences(spec, DescribedTopic(1, frozenset({1}), frozenset({1}),
                                                  {"cleanup.policy": "delete, compact"}), fix=True) == []


def test_the_replication_factor_needs_a_reassignment_and_min_isr_waits_for_it():
    found = _described(replicas=1, min_insync_replicas="1")
    assert topic_differences(SPEC, found, fix=True) == [
        TopicDifference("p.events", "replication factor", "1", "3", Outcome.NEEDS_REASSIGNMENT),
        TopicDifference("p.events", "min.insync.replicas", "1", "2", Outcome.AFTER_REASSIGNMENT,
                        "2 in-sync replicas of 1 would stop writes"),
    ]


def test_a_co_partitioned_topics_partition_count_cannot_be_fixed():
    (difference,) = topic_differences(SPEC, _described(partitions=6), fix=True)
    assert (difference.setting, difference.found, difference.wanted, difference.outcome) == (
        "partitions", "6", "4", Outcome.CANNOT_FIX
    )
    assert "co-partitioned" in difference.detail and not difference.resolved


def test_a_missing_topic_is_reported_missing():
    (difference,) = topic_differences(SPEC, None, fix=True)
    assert difference.outcome is Outcome.MISSING and str(difference) == "p.events: missing: run `turnlog topics create`"


def test_a_difference_reads_as_one_line():
    line = str(TopicDifference("p.dlq", "retention.ms", "86400000", "2592000000", Outcome.FIXED))
    assert line == "p.dlq: retention.ms is 86400000, wanted 2592000000: fixed"


# -- Faust declares its topics with the replication ------------------------------------------------
class _CreatingProducer:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    async def create_topic(self, **request: Any) -> None:
        self.created.append(request)


async def test_a_topic_faust_declares_gets_the_resolved_replication(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    app = make_app(TurnlogSettings(faust_data_dir=str(tmp_path)), "declare-check")
    topic = app.topic("declare-check-changelog", internal=True, compacting=True, config={"segment.ms": "1000"})
    producer = _CreatingProducer()

    async def get_producer() -> _CreatingProducer:
        return producer

    monkeypatch.setattr(topic, "_get_producer", get_producer)
    with pytest.raises(ConfigurationError, match="before the app's replication was resolved"):
        await topic.declare()
    assert producer.created == []

    configure_replication(app, THREE)
    await topic.declare()
    (request,) = producer.created
    assert request["replication"] == 3 and request["compacting"] is True
    assert request["config"] == {"segment.ms": "1000", "min.insync.replicas": "2",
                                 "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)}
    assert app.conf.topic_replication_factor == 3


class _ControllerAway(_CreatingProducer):
    """The cluster in a failover: the first ``failures`` requests find no controller."""

    def __init__(self, failures: list[BaseException]) -> None:
        super().__init__()
        self.failures = failures

    async def create_topic(self, **request: Any) -> None:
        if self.failures:
            raise self.failures.pop(0)
        await super().create_topic(**request)


@pytest.mark.parametrize("failure", [aiokafka_errors.NodeNotReadyError("node 1"), TimeoutError()])
async def test_a_topic_declared_while_the_controller_is_away_is_declared_once_it_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
):
    app = make_app(TurnlogSettings(faust_data_dir=str(tmp_path)), "declare-failover")
    configure_replication(app, THREE)
    topic = app.topic("declare-failover-changelog", internal=True, compacting=True)
    producer = _ControllerAway([failure, aiokafka_errors.KafkaConnectionError("node 2")])

    async def get_producer() -> _CreatingProducer:
        return producer

    monkeypatch.setattr(topic, "_get_producer", get_producer)
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    await topic.declare()
    assert len(producer.created) == 1 and producer.failures == []


async def test_a_topic_refused_for_good_is_not_declared_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    app = make_app(TurnlogSettings(faust_data_dir=str(tmp_path)), "declare-refused")
    configure_replication(app, THREE)
    topic = app.topic("declare-refused-changelog", internal=True, compacting=True)
    producer = _ControllerAway([aiokafka_errors.PolicyViolationError("refused"), aiokafka_errors.NodeNotReadyError()])

    async def get_producer() -> _CreatingProducer:
        return producer

    monkeypatch.setattr(topic, "_get_producer", get_producer)
    with pytest.raises(aiokafka_errors.PolicyViolationError):
        await topic.declare()
    assert producer.created == [] and len(producer.failures) == 1


_real_sleep = asyncio.sleep


async def _no_sleep(_delay: float, *args: Any) -> None:
    await _real_sleep(0)


# -- starting the local broker ------------------------------------------------------------------------
@pytest.fixture
def scripts_run(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, str]]]:
    """No broker answers, Postgres does (whether a real one runs here or not); the deploy scripts
    ``ensure_local_services`` would run are recorded, not run."""
    run: list[tuple[str, dict[str, str]]] = []
    monkeypatch.setattr(local, "broker_answers", lambda settings, timeout=5.0: False)
    monkeypatch.setattr(local, "_database_answers", lambda url: True)
    monkeypatch.setattr(local, "_run_script", lambda name, **environment: run.append((name, environment)))
    return run


@pytest.mark.parametrize("servers", ["127.0.0.1:9092", "localhost:9092", " localhost:9092,127.0.0.1:9092"])
def test_the_local_default_broker_is_started(servers: str, scripts_run: list[tuple[str, dict[str, str]]]):
    local.ensure_local_services(TurnlogSettings(bootstrap_servers=servers))
    assert scripts_run == [("kafka.sh", {"TURNLOG_KAFKA_NODES": "1", "TURNLOG_KAFKA_PORT": "9092",
                                         "TURNLOG_KAFKA_CONTROLLER_PORT": "9093"})]


def test_a_local_cluster_that_does_not_answer_is_not_started_but_explained(scripts_run: list):
    with pytest.raises(ConfigurationError) as refused:
        local.ensure_local_services(TurnlogSettings(bootstrap_servers="127.0.0.1:9192,127.0.0.1:9193,127.0.0.1:9194"))
    assert "no Kafka broker answers at 127.0.0.1:9192,127.0.0.1:9193,127.0.0.1:9194" in str(refused.value)
    assert "TURNLOG_KAFKA_NODES=3 bash deploy/services.sh start" in str(refused.value)
    assert scripts_run == []


@pytest.mark.parametrize("servers", ["127.0.0.1:9093", "127.0.0.1:9092,10.0.0.7:9092", "kafka.internal:9092"])
def test_servers_other_than_the_local_default_are_never_started(servers: str, scripts_run: list):
    with pytest.raises(ConfigurationError, match="no Kafka broker answers"):
        local.ensure_local_services(TurnlogSettings(bootstrap_servers=servers))
    assert scripts_run == []
