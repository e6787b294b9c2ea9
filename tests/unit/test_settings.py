import pytest
from pydantic import ValidationError

from turnlog.settings import TurnlogSettings


def test_a_bad_environment_value_fails_naming_the_key(monkeypatch):
    monkeypatch.setenv("TURNLOG_PARTITIONS", "zero")
    with pytest.raises(ValidationError, match="partitions"):
        TurnlogSettings()


def test_topic_names_derive_from_the_prefix_and_round_trip_through_the_environment(monkeypatch):
    settings = TurnlogSettings(topic_prefix="acme", partitions=4)
    assert settings.topics.all() == ("acme.events", "acme.transcript", "acme.dlq")
    for key, value in settings.as_environment().items():
        monkeypatch.setenv(key, value)
    assert TurnlogSettings() == settings


def test_an_illegal_topic_prefix_is_refused():
    with pytest.raises(ValidationError, match="topic_prefix"):
        TurnlogSettings(topic_prefix="has space")
