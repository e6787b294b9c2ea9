"""The replay agent's timing with overlapping turns, on a fake session (no broker); how the harness
names the sessions its agents record."""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
from pathlib import Path

import pytest

from turnlog.exceptions import ConfigurationError
from turnlog.tools.demo.agent import _play, replay_plan
from turnlog.tools.demo.runner import agent_session_options, load_sessions
from turnlog.tools.demo.transcripts import recording_time

from tests.unit.demo_turns import OVERLAPPING_TURNS

BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SPEED = 50.0  # 22 recorded seconds in 0.44 s
SESSIONS = Path(__file__).resolve().parents[2] / "data" / "sessions"


class FakeSession:
    """Records the calls the agent makes, in order."""

    def __init__(self, *, on_complete=None) -> None:  # noqa: ANN001
        self.calls: list[tuple[str, int, str]] = []
        self.started_at: dict[int, dt.datetime] = {}
        self.ended_at: dict[int, dt.datetime] = {}
        self._on_complete = on_complete

    def update_partial(self, turn_index: int, speaker: str, text: str, *, started_at: dt.datetime) -> None:
        self.calls.append(("partial", turn_index, text))
        self.started_at[turn_index] = started_at

    async def complete_turn(self, turn_index: int, speaker: str, text: str, *, started_at, ended_at, input_tokens, output_tokens) -> None:  # noqa: ANN001
        self.calls.append(("complete", turn_index, text))
        self.ended_at[turn_index] = ended_at
        if self._on_complete is not None:
            self._on_complete(turn_index)

    def completed(self) -> list[int]:
        return [i for kind, i, _ in self.calls if kind == "complete"]

    def first(self, kind: str, turn_index: int) -> int:
        return next(n for n, (k, i, _) in enumerate(self.calls) if (k, i) == (kind, turn_index))


async def test_overlapping_turns_are_open_together_and_complete_in_the_order_their_ends_fall():
    session = FakeSession()

    assert await _play(session, replay_plan(OVERLAPPING_TURNS), speed=SPEED, base_time=BASE, terminating=asyncio.Event()) is True

    assert session.completed() == [1, 0, 3, 2, 4, 5]
    assert session.first("partial", 2) < session.first("complete", 0)  # 0 and 2 open at once
    for kind, index, text in session.calls:
        whole = OVERLAPPING_TURNS[index].text
        assert text == whole if kind == "complete" else whole.startswith(text + " ")
    assert session.ended_at[2] == recording_time(BASE, 12.0) and session.started_at[4] == recording_time(BASE, 13.0)


async def test_a_resumed_plan_records_the_unfinished_turns_at_fresh_indexes_with_their_own_times():
    session = FakeSession()
    plan = replay_plan([OVERLAPPING_TURNS[2], OVERLAPPING_TURNS[3], OVERLAPPING_TURNS[5]], first_turn_index=7)

    assert await _play(session, plan, speed=SPEED, base_time=BASE, terminating=asyncio.Event()) is True

    assert session.completed() == [8, 7, 9]  # "right" (11.5) ends before "and cheap ..." (12)
    assert session.ended_at[9] == recording_time(BASE, 22.0)


async def test_sigterm_stops_new_turns_and_leaves_the_open_ones_to_the_drain():
    terminating = asyncio.Event()
    session = FakeSession(on_complete=lambda index: terminating.set() if index == 1 else None)

    assert await _play(session, replay_plan(OVERLAPPING_TURNS), speed=SPEED, base_time=BASE, terminating=terminating) is False

    assert session.completed() == [1]
    assert not any(index >= 3 for _, index, _ in session.calls)


async def test_a_failed_turn_stops_the_replay_with_its_error():
    class Refused(Exception):
        pass

    def refuse(index: int) -> None:
        if index == 0:
            raise Refused("no spool")

    session = FakeSession(on_complete=refuse)

    with pytest.raises(Refused):
        await _play(session, replay_plan(OVERLAPPING_TURNS), speed=SPEED, base_time=BASE, terminating=asyncio.Event())
    assert session.completed() == [1, 0]  # the open turns 2 and 3 were cancelled at once, 4 never began
    assert not any(index == 4 for _, index, _ in session.calls)


def test_the_harness_names_each_session_by_its_key_and_gives_its_agent_the_id(tmp_path):
    shutil.copy(SESSIONS / "ami-IS1004a.jsonl", tmp_path / "ami-IS1004a.jsonl")
    transcripts, paths = load_sessions(tmp_path, "r1")
    # The store, the latency logs and the reports name it by its key; the agent makes that key
    # from the fleet and the id it is given.
    assert list(transcripts) == list(paths) == ["demo:ami-IS1004a.r1"]
    assert agent_session_options("demo:ami-IS1004a.r1") == ["--fleet", "demo", "--session-id", "ami-IS1004a.r1"]
    shutil.move(tmp_path / "ami-IS1004a.jsonl", tmp_path / "ami IS1004a.jsonl")  # no session id holds a space
    with pytest.raises(ConfigurationError, match="cannot name a session"):
        load_sessions(tmp_path, "r1")
