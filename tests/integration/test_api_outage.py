"""The API during a database outage: 503 with Retry-After, never a raw 500."""

from __future__ import annotations

from fastapi.testclient import TestClient

from turnlog.api.app import UNAVAILABLE_RETRY_AFTER_SECONDS, create_app
from turnlog.settings import TurnlogSettings
from turnlog.sinks import open_store

TOKEN = "outage-token"


def test_every_read_answers_503_with_retry_after_while_the_database_is_away():
    # Nothing listens on port 1: every connection attempt fails at once.
    settings = TurnlogSettings(
        database_url="postgresql+psycopg://turnlog:turnlog@127.0.0.1:1/turnlog", api_tokens={TOKEN: ["*"]}
    )
    store = open_store(settings.database_url)
    app = create_app(settings, store, live=False)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(app, raise_server_exceptions=False) as client:
        for path in ("/api/sessions", "/api/sessions/some-session", "/api/sessions/some-session/transcript"):
            answer = client.get(path, headers=headers)
            assert answer.status_code == 503, (path, answer.status_code, answer.text)
            assert answer.headers["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER_SECONDS)
        # An erasure cannot be checked against the store nor queued in it: 503, nothing changed.
        answer = client.delete("/api/sessions/some-session", headers=headers, params={"wait": 0})
        assert answer.status_code == 503, answer.text
        assert answer.headers["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER_SECONDS)
    store.engine.dispose()
