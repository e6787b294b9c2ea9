"""Secrets out of messages: the URL redactor, the settings' dumps and errors, and the CLI's output
for a malformed or unreachable database URL (run as a subprocess: what an operator would see)."""

from __future__ import annotations

import os
import subprocess

import pytest
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from turnlog.deploy.processes import turnlog_command
from turnlog.redact import redact, redact_url
from turnlog.settings import SECRET_SETTINGS, TurnlogSettings
from turnlog.sinks import UnsupportedDatabaseError, open_store, parse_database_url, safe_url

PASSWORD = "pw-7f3a9c"  # distinctive: found only where it leaked


@pytest.mark.parametrize(("url", "shown"), [
    (f"postgresql+psycopg://turnlog:{PASSWORD}@db.internal:5432/turnlog",
     "postgresql+psycopg://turnlog:***@db.internal:5432/turnlog"),
    (f"postgresql://u@h/db?sslmode=require&password={PASSWORD}", "postgresql://u@h/db?password=***&sslmode=require"),  # SQLAlchemy sorts the keys
    (f"postgresql://u:pa/ss@{PASSWORD}@h:5432/db", "postgresql://u:***@h:5432/db"),  # an unencoded '@' in it
    (f"https://agent:{PASSWORD}@api.internal:8000", "https://agent:***@api.internal:8000"),
    (f"postgresql+psycopg://turnlog:{PASSWORD}@h:notaport/db", "postgresql+psycopg://turnlog:***@h:notaport/db"),
    (f"postgresql+psycopg//turnlog:{PASSWORD}@h/db", "postgresql+psycopg//turnlog:***@h/db"),  # no '://'
    ("sqlite:///var/lib/turnlog/store.db", "sqlite:///var/lib/turnlog/store.db"),
])
def test_a_url_keeps_everything_but_its_password(url, shown):
    assert redact_url(url) == shown
    assert PASSWORD not in redact(url)


def test_free_text_hides_every_url_password_in_it():
    text = (f"cannot reach 'postgresql://u:{PASSWORD}@h1/db' nor SASL_SSL://svc:{PASSWORD}@h2:9092, "
            f"token={PASSWORD} at https://h3/x?api_key={PASSWORD}&page=2; h4:9092,h5:9092 fine")
    hidden = redact(text)
    assert PASSWORD in hidden  # a bare 'token=' outside a query is not a URL: kept
    assert hidden.count(PASSWORD) == 1
    assert "postgresql://u:***@h1/db" in hidden and "SASL_SSL://svc:***@h2:9092" in hidden
    assert "?api_key=***&page=2" in hidden and "h4:9092,h5:9092 fine" in hidden


def test_a_sqlalchemy_url_and_a_secret_str_go_through_safe_url():
    url = f"postgresql+psycopg://turnlog:{PASSWORD}@h:5432/db"
    assert safe_url(make_url(url)) == safe_url(TurnlogSettings(database_url=url).database_url) == redact_url(url)


@pytest.mark.parametrize("url", [
    f"not a url {PASSWORD}", PASSWORD, f"postgresql+psycopg://turnlog:{PASSWORD}@h:notaport/db",
    f"postgresql+psycopg//turnlog:{PASSWORD}@h/db",
])
def test_a_malformed_database_url_fails_without_showing_it(url):
    with pytest.raises(UnsupportedDatabaseError) as failed:
        open_store(TurnlogSettings(database_url=url).database_url)
    assert PASSWORD not in str(failed.value) and "not shown" in str(failed.value)
    assert failed.value.__cause__ is None and failed.value.__context__ is None  # nor through a chained error


def test_the_database_url_is_a_secret_in_every_rendering_of_the_settings(monkeypatch):
    url = f"postgresql+psycopg://turnlog:{PASSWORD}@h:5432/db"
    settings = TurnlogSettings(
        database_url=url, api_token=f"tok-{PASSWORD}", api_tokens={f"tokens-{PASSWORD}": ["fleet-a"]},
        kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="PLAIN", kafka_sasl_username="svc",
        kafka_sasl_password=f"sasl-{PASSWORD}",
    )
    for rendering in (repr(settings), str(settings), str(settings.model_dump()), settings.model_dump_json()):
        assert PASSWORD not in rendering
    assert settings.model_dump(mode="json")["api_tokens"] == {"<token 1>": ["fleet-a"]}  # the fleets stay readable
    assert parse_database_url(settings.database_url).host == "h"
    environment = settings.as_environment()  # a child process gets the values themselves
    assert environment["TURNLOG_DATABASE_URL"] == url
    assert environment["TURNLOG_API_TOKENS"] == f'{{"tokens-{PASSWORD}": ["fleet-a"]}}'
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    assert TurnlogSettings() == settings


def test_every_secret_setting_is_known_as_one():
    assert {"database_url", "api_token", "api_tokens", "kafka_sasl_password", "kafka_ssl_key_password"} <= SECRET_SETTINGS
    assert not {"bootstrap_servers", "api_url", "spool_dir"} & SECRET_SETTINGS


def test_a_bad_api_tokens_entry_fails_without_naming_the_token():
    with pytest.raises(ValidationError) as failed:
        TurnlogSettings(api_tokens={f"tokens-{PASSWORD}": "not a list"})
    assert PASSWORD not in str(failed.value)
    assert [error["loc"] for error in failed.value.errors()] == [("api_tokens",)]


def run_cli(*args: str, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TURNLOG_")}
    return subprocess.run(turnlog_command(*args), env={**env, **environment}, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("command", ["migrate", "sink"])
@pytest.mark.parametrize("url", [
    f"postgresql+psycopg://turnlog:{PASSWORD}@127.0.0.1:notaport/turnlog",
    f"postgresql+psycopg//turnlog:{PASSWORD}@127.0.0.1/turnlog",
    f"not a url {PASSWORD}",
], ids=["bad-port", "no-scheme-separator", "not-a-url"])
def test_the_cli_never_prints_the_password_of_a_malformed_database_url(command, url):
    done = run_cli(command, TURNLOG_DATABASE_URL=url, TURNLOG_BOOTSTRAP_SERVERS="127.0.0.1:1")
    assert done.returncode == 1
    assert "UnsupportedDatabaseError" in done.stderr and "not shown" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr


def test_the_cli_never_prints_the_password_of_an_unreachable_database():
    done = run_cli("migrate", TURNLOG_DATABASE_URL=f"postgresql+psycopg://turnlog:{PASSWORD}@127.0.0.1:1/turnlog")
    assert done.returncode != 0 and "127.0.0.1" in done.stdout + done.stderr  # it failed, and says where
    assert PASSWORD not in done.stdout + done.stderr


def test_the_cli_never_prints_secrets_in_a_failed_check_of_several_settings():
    done = run_cli(
        "migrate", TURNLOG_DATABASE_URL=f"postgresql://u:{PASSWORD}@h/db", TURNLOG_KAFKA_SECURITY_PROTOCOL="SASL_SSL",
        TURNLOG_KAFKA_SASL_PASSWORD=f"sasl-{PASSWORD}", TURNLOG_API_TOKENS=f'{{"tok-{PASSWORD}": ["*"]}}',
    )
    assert done.returncode == 2 and "needs kafka_sasl_mechanism, kafka_sasl_username" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr
