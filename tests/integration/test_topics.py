"""Creating and deleting a pipeline's topics on the real broker (``turnlog.deploy.topics``)."""

from __future__ import annotations

import uuid

import pytest

import turnlog.kafka as kafka
from turnlog.deploy.topics import create_topics, delete_topics_with_prefix
from turnlog.settings import TurnlogSettings

from tests.support import wait_until

pytestmark = pytest.mark.integration


def _topics(settings: TurnlogSettings) -> set[str]:
    return set(kafka.admin(settings).list_topics(timeout=10).topics)


def test_deleting_by_prefix_takes_the_pipelines_topics_and_leaves_a_longer_prefix_alone(kafka_bootstrap: str):
    run = f"test-{uuid.uuid4().hex[:10]}"
    mine = TurnlogSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=run, partitions=1)
    # Faust's changelog is named after the app id (the consumer group), not the topic prefix.
    changelog = TurnlogSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=f"{run}-sequencer-state", partitions=1)
    neighbour = TurnlogSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=f"{run}x", partitions=1)
    for settings in (mine, changelog, neighbour):
        create_topics(settings)
    try:
        deleted = delete_topics_with_prefix(mine, run)
        assert deleted == sorted([*mine.topics.all(), *changelog.topics.all()])
        wait_until(lambda: not set(deleted) & _topics(mine), timeout=30, what="the deleted topics gone from the metadata")
        assert set(neighbour.topics.all()) <= _topics(mine)
        assert delete_topics_with_prefix(mine, run) == []  # nothing left: a no-op
    finally:
        delete_topics_with_prefix(neighbour, f"{run}x")
