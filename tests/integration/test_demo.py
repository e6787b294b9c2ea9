"""The demo itself on real transcripts: agent processes, a real SIGKILL mid-turn, resume, verdict."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from turnlog.schemas.session_keys import session_key
from turnlog.tools.demo.keys import DEMO_FLEET
from turnlog.tools.demo.runner import DemoOptions, choose_kills, run_demo
from turnlog.tools.demo.transcripts import load_transcript

from tests.integration.conftest import isolated_settings

SESSIONS = Path(__file__).resolve().parents[2] / "data" / "sessions"
CHOSEN = ("ami-IS1004a.jsonl", "ami-ES2005a.jsonl")


@pytest.fixture
def transcripts(tmp_path: Path) -> Path:
    if not SESSIONS.is_dir():
        pytest.fail(f"the shared transcripts are missing at {SESSIONS} (the repository must sit beside shared/)", pytrace=False)
    folder = tmp_path / "sessions"
    folder.mkdir()
    for name in CHOSEN:
        shutil.copy(SESSIONS / name, folder / name)
    return folder


def test_the_demo_kills_an_agent_mid_turn_and_every_session_stays_intact(kafka_bootstrap, postgres_databases, tmp_path, transcripts):
    settings = isolated_settings(kafka_bootstrap, postgres_databases.create(), tmp_path)
    report_path = tmp_path / "report.json"
    options = DemoOptions(sessions_dir=transcripts, speed=40, kills=1, seed=3, report_path=report_path, timeout=120, log_dir=tmp_path / "logs")

    assert run_demo(settings, options) is True

    report = json.loads(report_path.read_text())
    assert report["ok"] and len(report["kills"]) == 1
    # A session is reported by its key (as the store holds it): the demo fleet's '<file stem>.<run id>'.
    by_file = {s["session_id"].rsplit(".", 1)[0]: s for s in report["sessions"]}  # '<fleet>:<file stem>'
    killed = by_file[report["kills"][0]["session_id"].rsplit(".", 1)[0]]
    # The kill lands mid-turn, after two flushes of it: at least that turn is left interrupted
    # (overlapping turns open at that moment may be too), and each is said again in full.
    assert killed["interrupted_turns"] >= 1 and killed["generations"] == 2
    assert killed["stored_turns"] == killed["input_turns"] + killed["interrupted_turns"]
    for name in CHOSEN:
        session = by_file[session_key(DEMO_FLEET, name.removesuffix(".jsonl"))]
        assert session["status"] == "finalized" and session["problems"] == []
        assert session["complete_turns"] == len(load_transcript(transcripts / name))


def test_kill_points_are_mid_session_turns_long_enough_for_two_flushes():
    turns = {name: load_transcript(SESSIONS / name) for name in CHOSEN}
    [plan] = choose_kills(turns, 1, speed=40, flush_interval=0.2, seed=3)
    turn = turns[plan.session_id][plan.input_turn]
    assert (turn.end_s - turn.start_s) / 40 >= 0.8
    assert len(turns[plan.session_id]) // 5 <= plan.input_turn < len(turns[plan.session_id]) * 4 // 5
    assert 0.5 <= plan.at_fraction <= 0.8
