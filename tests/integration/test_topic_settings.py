"""Topic settings on the real broker: ``create_topics`` reports how existing topics differ and
refuses a replication the brokers cannot hold; ``check_topics`` reports, fixes what a config
change fixes, and leaves everything alone in a dry run; ``turnlog topics check`` prints one
line per difference and exits 1 until nothing remains."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType
from typer.testing import CliRunner

from turnlog import kafka
from turnlog.cli import app as cli
from turnlog.deploy.topics import Outcome, TopicDifference, check_topics, create_topics
from turnlog.exceptions import ConfigurationError
from turnlog.kafka.replication import live_broker_count
from turnlog.settings import TurnlogSettings

from tests.integration.conftest import drop_topics
from tests.support import create_topic

pytestmark = pytest.mark.integration

#: What the test's DLQ is created with before ``turnlog topics create`` runs: none of it as asked.
WRONG = {"retention.ms": "3600000", "cleanup.policy": "compact", "min.insync.replicas": "2"}


@pytest.fixture
def settings(kafka_bootstrap: str) -> Iterator[TurnlogSettings]:
    """Settings whose topics, and Faust app ids (so Faust's topics), all start with a unique prefix."""
    run = f"test-{uuid.uuid4().hex[:10]}"
    settings = TurnlogSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=run, partitions=2,
                               sequencer_group=f"{run}-sequencer", finalizer_group=f"{run}-finalizer",
                               dlq_retention_ms=7 * 24 * 3600 * 1000)
    yield settings
    drop_topics(settings)


def _configs(settings: TurnlogSettings, topic: str) -> dict[str, Any]:
    admin = kafka.admin(settings)
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)], request_timeout=10).values()
    return {name: entry.value for name, entry in future.result(timeout=30).items()}


def _create_misconfigured_dlq(settings: TurnlogSettings) -> str:
    return create_topic(kafka.admin(settings), NewTopic(settings.topics.dlq, settings.partitions, 1, config=WRONG))


def _wanted(settings: TurnlogSettings) -> dict[str, str]:
    """The DLQ's settings as asked, on the broker the tests run against (a single broker: min ISR 1)."""
    min_insync = str(max(1, min(3, live_broker_count(settings)) - 1))
    return {"retention.ms": str(settings.dlq_retention_ms), "cleanup.policy": "delete", "min.insync.replicas": min_insync,
            "segment.ms": str(min(settings.dlq_retention_ms, 24 * 3600 * 1000))}


def test_create_reports_an_existing_topic_that_differs_and_changes_nothing(settings: TurnlogSettings):
    dlq = _create_misconfigured_dlq(settings)
    before = _configs(settings, dlq)
    result = create_topics(settings)
    assert dlq not in result.created and len(result.created) == 6  # the other three of turnlog's, Faust's three
    wanted = _wanted(settings)
    expected = {
        TopicDifference(dlq, name, before[name], wanted[name], Outcome.WOULD_FIX)
        for name in wanted if before[name] != wanted[name]
    }
    assert set(result.differences) == expected
    assert {name: _configs(settings, dlq)[name] for name in WRONG} == WRONG


def test_check_reports_fixes_and_then_finds_everything_as_asked(settings: TurnlogSettings):
    dlq = _create_misconfigured_dlq(settings)
    create_topics(settings)

    dry = check_topics(settings, fix=False)
    assert not dry.ok and len(dry.topics) == 7
    assert {(d.topic, d.setting) for d in dry.differences} >= {(dlq, "retention.ms"), (dlq, "cleanup.policy")}
    assert {d.outcome for d in dry.differences} == {Outcome.WOULD_FIX}
    assert _configs(settings, dlq)["retention.ms"] == WRONG["retention.ms"]  # a dry run changes nothing

    fixed = check_topics(settings)
    assert [(d.topic, d.setting, d.outcome) for d in fixed.differences] == [
        (d.topic, d.setting, Outcome.FIXED) for d in dry.differences
    ]
    assert fixed.ok
    wanted = _wanted(settings)
    assert {name: _configs(settings, dlq)[name] for name in wanted} == wanted

    again = check_topics(settings)
    assert again.ok and again.differences == ()


def test_a_missing_topic_is_reported_and_not_created_by_check(settings: TurnlogSettings):
    result = check_topics(settings)
    assert not result.ok
    assert {d.outcome for d in result.differences} == {Outcome.MISSING}
    assert {d.topic for d in result.differences} == set(result.topics)
    assert not set(result.topics) & set(kafka.admin(settings).list_topics(timeout=10).topics)


def test_create_refuses_more_replicas_than_live_brokers_before_creating_anything(settings: TurnlogSettings):
    live = live_broker_count(settings)
    too_many = settings.model_copy(update={"replication_factor": live + 1})
    with pytest.raises(ConfigurationError) as refused:
        create_topics(too_many)
    assert f"replication factor {live + 1}" in str(refused.value)
    assert f"{live} live broker(s)" in str(refused.value)
    listed = kafka.admin(settings).list_topics(timeout=10).topics
    assert not [name for name in listed if name.startswith(settings.topic_prefix)]
    with pytest.raises(ConfigurationError, match="more than the"):
        check_topics(too_many)


def test_create_refuses_min_isr_not_below_the_factor(settings: TurnlogSettings):
    bad = settings.model_copy(update={"replication_factor": 1, "min_insync_replicas": 2})
    with pytest.raises(ConfigurationError, match=r"min.insync.replicas 2 .* replication factor 1"):
        create_topics(bad)
    listed = kafka.admin(settings).list_topics(timeout=10).topics
    assert not [name for name in listed if name.startswith(settings.topic_prefix)]


def test_the_check_command_prints_a_line_per_difference_and_exits_1_until_fixed(settings: TurnlogSettings):
    dlq = _create_misconfigured_dlq(settings)
    create_topics(settings)
    environment = {f"TURNLOG_{name.upper()}": str(getattr(settings, name)) for name in (
        "bootstrap_servers", "topic_prefix", "partitions", "sequencer_group", "finalizer_group", "dlq_retention_ms"
    )}
    runner = CliRunner()

    dry = runner.invoke(cli, ["topics", "check", "--dry-run"], env=environment)
    assert dry.exit_code == 1, dry.output
    assert f"{dlq}: retention.ms is 3600000, wanted {settings.dlq_retention_ms}: fixable by a config change" in dry.output
    assert f"{dlq}: cleanup.policy is compact, wanted delete:" in dry.output

    fixing = runner.invoke(cli, ["topics", "check"], env=environment)
    assert fixing.exit_code == 0, fixing.output
    assert f"{dlq}: retention.ms is 3600000, wanted {settings.dlq_retention_ms}: fixed" in fixing.output

    clean = runner.invoke(cli, ["topics", "check", "--dry-run"], env=environment)
    assert clean.exit_code == 0 and "every topic is as the settings ask" in clean.output
