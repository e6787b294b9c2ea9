"""Where a recorder's resume gets its grant: the resume source it was given, the API by
default, and a clear error with neither (no broker: the recorder starts against a closed port)."""

from __future__ import annotations

import pytest

from turnlog.exceptions import ConfigurationError
from turnlog.producers import ApiResumeSource, ResumeGrant, SessionClosedError, SessionNotFoundError, SessionRecorder
from turnlog.resume_barrier import StoreResumeSource, resume_source_for
from turnlog.schemas import SessionStatus
from turnlog.settings import TurnlogSettings


class FakeSource:
    """A resume source that answers from a table and records its calls."""

    def __init__(self, grants: dict[str, ResumeGrant | None]) -> None:
        self.grants = grants
        self.asked: list[tuple[str, float]] = []
        self.closed = 0

    async def grant(self, session_id: str, timeout: float) -> ResumeGrant | None:
        self.asked.append((session_id, timeout))
        return self.grants.get(session_id)

    def close(self) -> None:
        self.closed += 1


def settings(tmp_path, **overrides) -> TurnlogSettings:
    return TurnlogSettings(spool_dir=str(tmp_path), bootstrap_servers="127.0.0.1:1",
                           spool_close_timeout_seconds=0.2, **overrides)


def ended_grant(session_id: str) -> ResumeGrant:
    return ResumeGrant(session_id=session_id, epoch=3, status=SessionStatus.ENDED, last_seq=9, max_turn_index=4,
                       turns=(), fleet="f")


async def test_a_recorder_without_a_resume_source_or_api_url_refuses_to_resume_and_says_how(tmp_path):
    async with SessionRecorder(settings(tmp_path)) as recorder:
        with pytest.raises(ConfigurationError) as refused:
            await recorder.resume("s-1", timeout=1)
    assert "TURNLOG_API_URL" in str(refused.value) and "StoreResumeSource" in str(refused.value)


async def test_the_recorder_asks_its_resume_source_and_closes_it(tmp_path):
    source = FakeSource({"ended": ended_grant("ended"), "missing": None})
    recorder = SessionRecorder(settings(tmp_path), resume_source=source)
    async with recorder:
        with pytest.raises(SessionClosedError, match="ended"):
            await recorder.resume("ended", timeout=5)
        with pytest.raises(SessionNotFoundError):
            await recorder.resume("missing", timeout=5)
        assert [session_id for session_id, _ in source.asked] == ["ended", "missing"]
        assert all(0 < timeout <= 5 for _, timeout in source.asked)
        assert source.closed == 0
    assert source.closed == 1


def test_an_api_url_makes_the_api_the_default_and_a_given_source_wins(tmp_path):
    with_api = settings(tmp_path, api_url="http://127.0.0.1:8000", api_token="tok")
    assert isinstance(SessionRecorder(with_api)._resume_source, ApiResumeSource)
    given = FakeSource({})
    assert SessionRecorder(with_api, resume_source=given)._resume_source is given
    assert SessionRecorder(settings(tmp_path))._resume_source is None


def test_resume_source_for_picks_the_api_when_it_is_set_else_the_store(tmp_path):
    assert isinstance(resume_source_for(settings(tmp_path, api_url="http://127.0.0.1:8000")), ApiResumeSource)
    store_source = resume_source_for(settings(tmp_path))
    assert isinstance(store_source, StoreResumeSource)
    store_source.close()  # nothing was opened: closing is a no-op
