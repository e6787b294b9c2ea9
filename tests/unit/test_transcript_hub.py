"""The transcript hub's start: finding the topic's partitions (a stub lookup: no broker)."""

from __future__ import annotations

import threading
import time

import pytest

from turnlog import follow, kafka
from turnlog.follow import TranscriptHub
from turnlog.settings import TurnlogSettings


class Partitions:
    """``partitions(topic)`` failing with each of ``errors`` in turn, then answering."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def partitions(self, topic: str) -> list[int]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return [0, 1, 2]


def test_the_partitions_are_looked_up_again_while_the_topic_is_missing_or_the_broker_fails(monkeypatch, caplog):
    monkeypatch.setattr(follow, "TOPIC_RETRY_SECONDS", 0.01)
    lookups = Partitions(kafka.UnknownTopicError("no topic t.transcript"), kafka.BrokerUnavailableError("broker away", retriable=True))
    hub = TranscriptHub(TurnlogSettings())
    assert hub._partitions(lookups, "t.transcript") == [0, 1, 2]
    assert lookups.calls == 3
    assert "does not exist (yet)" in caplog.text and "broker away" in caplog.text


def test_a_stop_ends_the_wait_for_the_topic(monkeypatch):
    monkeypatch.setattr(follow, "TOPIC_RETRY_SECONDS", 60.0)
    lookups = Partitions(*[kafka.UnknownTopicError("no topic")] * 100)
    hub = TranscriptHub(TurnlogSettings())
    threading.Timer(0.1, hub._stopping.set).start()
    began = time.monotonic()
    assert hub._partitions(lookups, "t.transcript") is None
    assert time.monotonic() - began < 10 and lookups.calls == 1  # no lookup after the stop


def test_an_error_that_is_not_the_broker_s_is_not_retried():
    lookups = Partitions(ValueError("a bug"))
    hub = TranscriptHub(TurnlogSettings())
    with pytest.raises(ValueError, match="a bug"):
        hub._partitions(lookups, "t.transcript")
    assert lookups.calls == 1
