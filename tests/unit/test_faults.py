import pytest

from turnlog.exceptions import ConfigurationError
from turnlog.faults import POINTS, FaultAction, parse_faults


def test_fault_specs_parse():
    armed = parse_faults(
        "sink.after_write=kill, sink.after_commit=kill@3,producer.after_produce=stall:250,"
        "sink.after_poll=stop@2,sequencer.after_emit=stall:900@4,finalizer.after_update=stop"
    )
    assert armed == {
        "sink.after_write": FaultAction("kill", on_hit=1),
        "sink.after_commit": FaultAction("kill", on_hit=3),
        "producer.after_produce": FaultAction("stall", stall_ms=250, on_hit=0),
        "sink.after_poll": FaultAction("stop", on_hit=2),
        "sequencer.after_emit": FaultAction("stall", stall_ms=900, on_hit=4),
        "finalizer.after_update": FaultAction("stop", on_hit=1),
    }
    assert parse_faults("") == {}


@pytest.mark.parametrize("spec", [
    "sink.nowhere=kill", "sink.after_write=explode", "sink.after_write=kill@x", "sink.after_write=stall:",
    "sink.after_write=stop@x", "sink.after_write=stall:10@x",
])
def test_bad_fault_specs_fail_naming_the_problem(spec):
    with pytest.raises(ConfigurationError, match="TURNLOG_FAULTS"):
        parse_faults(spec)


def test_every_point_is_placed_in_the_code():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    sources = "".join(p.read_text() for d in ("producers", "stream_processors", "sinks", "turnlog/ops") for p in (root / d).rglob("*.py"))
    for name in POINTS:
        assert f'fault_point("{name}")' in sources, name


def test_a_bad_value_does_not_break_importing_turnlog():
    """TURNLOG_FAULTS is read on first use, not at import: a library user importing
    turnlog (schemas, the recorder, the sink) with a malformed value gets no error."""
    import os
    import subprocess
    import sys

    modules = "turnlog.schemas, turnlog.faults, turnlog.producers.drainer, turnlog.sinks.service, turnlog.stream_processors.finalizer"
    done = subprocess.run(
        [sys.executable, "-c", f"import {modules}"],
        env={**os.environ, "TURNLOG_FAULTS": "sink.nowhere=kill"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def unparsed_faults(monkeypatch):
    """The module as just imported: TURNLOG_FAULTS not read yet (restored afterwards)."""
    from turnlog import faults

    monkeypatch.setattr(faults, "_armed", None)
    return faults


def test_a_bad_value_fails_at_the_first_fault_point_naming_the_key(unparsed_faults, monkeypatch):
    monkeypatch.setenv("TURNLOG_FAULTS", "sink.after_write=explode")
    with pytest.raises(ConfigurationError, match="TURNLOG_FAULTS: bad action 'explode'"):
        unparsed_faults.fault_point("sink.after_poll")
    with pytest.raises(ConfigurationError, match="TURNLOG_FAULTS"):  # not cached as "nothing armed"
        unparsed_faults.armed_faults()


def test_the_value_is_parsed_once_and_counts_hits(unparsed_faults, monkeypatch):
    monkeypatch.setenv("TURNLOG_FAULTS", "sink.after_poll=stall:0")
    unparsed_faults.fault_point("sink.after_poll")
    unparsed_faults.fault_point("sink.after_write")  # not armed: nothing happens
    monkeypatch.setenv("TURNLOG_FAULTS", "")  # read already: a later change is not seen
    armed = unparsed_faults.armed_faults()
    assert list(armed) == ["sink.after_poll"] and armed["sink.after_poll"].hits == 1


def test_the_cli_refuses_a_bad_value_at_start_up(unparsed_faults, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from turnlog.cli import app

    monkeypatch.setenv("TURNLOG_FAULTS", "sink.nowhere=kill")
    monkeypatch.setenv("TURNLOG_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    result = CliRunner().invoke(app, ["migrate"])
    assert isinstance(result.exception, ConfigurationError) and "TURNLOG_FAULTS" in str(result.exception)
    assert not (tmp_path / "store.db").exists()  # refused before the command did anything
