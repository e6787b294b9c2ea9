"""Token scoping of the HTTP API (pure logic), and the token settings' checks at load."""

import pytest
from pydantic import ValidationError

from turnlog.api.auth import TokenTable
from turnlog.settings import TurnlogSettings

TABLE = TokenTable({"tok-a": ["fleet-a"], "tok-ab": ["fleet-a", "fleet-b"], "tok-all": ["*"]})


def test_a_token_grants_exactly_its_fleets():
    scope = TABLE.scope_of("Bearer tok-a")
    assert scope is not None and scope.fleets == frozenset({"fleet-a"})
    assert scope.allows("fleet-a") and not scope.allows("fleet-b") and not scope.allows(None)


def test_the_wildcard_grants_every_fleet():
    scope = TABLE.scope_of("bearer tok-all")
    assert scope is not None and scope.fleets is None and scope.allows("anything")


def test_missing_malformed_or_unknown_tokens_grant_nothing():
    for header in (None, "", "Bearer", "Bearer ", "Basic tok-a", "tok-a", "Bearer tok-a2", "Bearer TOK-A"):
        assert TABLE.scope_of(header) is None, header


def test_an_empty_table_refuses_everyone():
    assert TokenTable({}).scope_of("Bearer anything") is None
    assert TokenTable({"": ["*"]}).scope_of("Bearer ") is None


def test_a_malformed_token_setting_never_prints_the_token(monkeypatch):
    from typer.testing import CliRunner

    from turnlog.cli import app

    monkeypatch.setenv("TURNLOG_API_TOKENS", '{"tok-secret-value": "fleet-a"}')
    result = CliRunner().invoke(app, ["migrate"])
    assert result.exit_code == 2
    assert "TURNLOG_API_TOKENS" in result.output
    assert "secret" not in result.output.lower()


@pytest.mark.parametrize(
    ("tokens", "position", "problem"),
    [
        ({"tok-secret-1": []}, "#1 of 1", "has no fleets"),
        ({"tok-secret-1": ["fleet-a"], "tok-secret-2": []}, "#2 of 2", "has no fleets"),
        ({"tok-secret-1": ["fleet-a"], "tok-secret-2": ["fleet-b", " "]}, "#2 of 2", "names an empty fleet"),
        ({" ": ["*"]}, "#1 of 1", "is empty"),
        ({" tok-secret-1": ["*"]}, "#1 of 1", "whitespace"),
    ],
)
def test_a_token_that_grants_nothing_is_refused_at_load_by_its_position_never_by_itself(tokens, position, problem):
    with pytest.raises(ValidationError) as refused:
        TurnlogSettings(api_tokens=tokens)
    message = str(refused.value)
    assert f"api_tokens: token {position}" in message and problem in message
    assert "secret" not in message


def test_per_token_limits_may_not_exceed_the_global_ones():
    with pytest.raises(ValidationError, match="api_resume_per_token"):
        TurnlogSettings(api_resume_workers=2, api_resume_per_token=3)
    with pytest.raises(ValidationError, match="api_max_streams_per_token"):
        TurnlogSettings(api_max_streams=4, api_max_streams_per_token=5)
    defaults = TurnlogSettings()
    assert (defaults.api_resume_workers, defaults.api_resume_per_token) == (8, 2)
    assert (defaults.api_max_streams, defaults.api_max_streams_per_token) == (256, 16)
    assert defaults.api_docs is False


def test_each_token_is_numbered_by_its_position_for_the_per_token_limits():
    assert [TABLE.scope_of(f"Bearer {t}").token_number for t in ("tok-a", "tok-ab", "tok-all")] == [1, 2, 3]
