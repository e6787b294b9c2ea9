import pytest
from pydantic import ValidationError

from turnlog.settings import TurnlogSettings


def test_a_bad_environment_value_fails_naming_the_key(monkeypatch):
    monkeypatch.setenv("TURNLOG_PARTITIONS", "zero")
    with pytest.raises(ValidationError, match="partitions"):
        TurnlogSettings()


def test_topic_names_derive_from_the_prefix_and_round_trip_through_the_environment(monkeypatch):
    settings = TurnlogSettings(topic_prefix="acme", partitions=4)
    assert settings.topics.all() == ("acme.events", "acme.transcript", "acme.dlq", "acme.erasures")
    for key, value in settings.as_environment().items():
        monkeypatch.setenv(key, value)
    assert TurnlogSettings() == settings


def test_an_illegal_topic_prefix_is_refused():
    with pytest.raises(ValidationError, match="topic_prefix"):
        TurnlogSettings(topic_prefix="has space")


def test_the_api_token_reaches_a_child_process_unmasked_and_never_shows_in_repr(monkeypatch):
    settings = TurnlogSettings(api_url="http://turnlog.internal:8000/", api_token="s3cret-tok")
    assert settings.api_url == "http://turnlog.internal:8000"  # one form: no trailing slash
    assert "s3cret-tok" not in repr(settings)
    environment = settings.as_environment()
    assert environment["TURNLOG_API_TOKEN"] == "s3cret-tok"
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    assert TurnlogSettings().api_token.get_secret_value() == "s3cret-tok"


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://host", "http://", ""])
def test_an_api_url_that_is_not_http_is_refused(url):
    with pytest.raises(ValidationError, match="api_url"):
        TurnlogSettings(api_url=url)
