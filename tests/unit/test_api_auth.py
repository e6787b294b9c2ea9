"""Token scoping of the HTTP API (pure logic)."""

from turnlog.api.auth import TokenTable

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
