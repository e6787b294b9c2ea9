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


def _run_settings(kafka_bootstrap: str, prefix: str, **overrides: object) -> TurnlogSettings:
    """Settings whose topics and Faust app ids (so Faust's topics) all start with ``prefix``."""
    return TurnlogSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, sequencer_group=f"{prefix}-sequencer",
                           finalizer_group=f"{prefix}-finalizer", **{"partitions": 1, **overrides})


def test_deleting_by_prefix_takes_the_pipelines_topics_and_leaves_a_longer_prefix_alone(kafka_bootstrap: str):
    run = f"test-{uuid.uuid4().hex[:10]}"
    mine = _run_settings(kafka_bootstrap, run)
    neighbour = _run_settings(kafka_bootstrap, f"{run}x")
    # Faust's changelog and assignor topics are named after the app ids (the consumer groups).
    created = {settings.topic_prefix: create_topics(settings).created for settings in (mine, neighbour)}
    assert any(name.endswith("-changelog") for name in created[run])
    try:
        deleted = delete_topics_with_prefix(mine, run)
        assert deleted == sorted(created[run])
        wait_until(lambda: not set(deleted) & _topics(mine), timeout=30, what="the deleted topics gone from the metadata")
        assert set(created[f"{run}x"]) <= _topics(mine)
        assert delete_topics_with_prefix(mine, run) == []  # nothing left: a no-op
    finally:
        delete_topics_with_prefix(neighbour, f"{run}x")
