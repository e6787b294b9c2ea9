"""Ready files (turnlog/readiness.py): written atomically, removed, nothing when unset; who writes
them when (the Faust sensor, the sink, the API's hub), and the process runner that reads them."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from turnlog import readiness
from turnlog.exceptions import ConfigurationError
from turnlog.readiness import NotReadyError, ReadyMark, mark_not_ready, mark_ready, read_ready
from turnlog.settings import TurnlogSettings

# --- The file ---------------------------------------------------------------------------------------


def test_unset_nothing_is_written_or_removed(tmp_path):
    assert mark_ready(None, "sink") is None
    assert mark_not_ready(None) is False
    assert list(tmp_path.iterdir()) == []


def test_the_mark_is_the_component_this_pid_and_the_time_as_json(tmp_path):
    path = tmp_path / "sink.ready"
    before = time.time()
    mark = mark_ready(path, "sink")
    after = time.time()
    body = json.loads(path.read_text())
    assert set(body) == {"component", "pid", "ready_at"}
    assert body["component"] == "sink" and body["pid"] == os.getpid()
    assert before <= body["ready_at"] <= after
    assert mark == ReadyMark("sink", os.getpid(), body["ready_at"]) == read_ready(path)


def test_the_body_is_written_aside_then_replaces_the_file_in_one_step(tmp_path, monkeypatch):
    path = tmp_path / "api.ready"
    mark_ready(path, "old")
    seen = []
    real_replace = os.replace

    def replace(source, target):
        # At the swap: the target still holds the old mark whole, the new one is complete beside it.
        seen.append((Path(source).parent, json.loads(Path(target).read_text())["component"],
                     json.loads(Path(source).read_text())["component"]))
        real_replace(source, target)

    monkeypatch.setattr(readiness.os, "replace", replace)
    mark_ready(path, "api")
    assert seen == [(tmp_path, "old", "api")]
    assert read_ready(path).component == "api"
    assert [p.name for p in tmp_path.iterdir()] == ["api.ready"]  # no temporary file left


def test_a_failed_swap_keeps_the_old_mark_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "sink.ready"
    mark_ready(path, "old")

    def replace(source, target):
        raise OSError("disk says no")

    monkeypatch.setattr(readiness.os, "replace", replace)
    with pytest.raises(OSError, match="disk says no"):
        mark_ready(path, "new")
    assert read_ready(path).component == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["sink.ready"]


def test_a_missing_folder_is_an_error_not_a_silent_no_op(tmp_path):
    with pytest.raises(FileNotFoundError):
        mark_ready(tmp_path / "gone" / "sink.ready", "sink")
    assert list(tmp_path.iterdir()) == []


def test_not_ready_removes_the_file_once(tmp_path):
    path = tmp_path / "sink.ready"
    mark_ready(path, "sink")
    assert mark_not_ready(path) is True
    assert not path.exists() and read_ready(path) is None
    assert mark_not_ready(path) is False


@pytest.mark.parametrize("text", ["", "{not json", '{"component": "sink", "pid": 1}',
                                  '{"component": "sink", "pid": "1", "ready_at": 1.0}', "[1, 2, 3]"])
def test_a_file_that_is_not_a_ready_file_is_an_error(tmp_path, text):
    path = tmp_path / "x.ready"
    path.write_text(text)
    with pytest.raises(ValueError, match="not a ready file"):
        read_ready(path)


def test_the_setting_is_read_from_turnlog_ready_file(monkeypatch, tmp_path):
    assert TurnlogSettings().ready_file is None
    monkeypatch.setenv("TURNLOG_READY_FILE", str(tmp_path / "s.ready"))
    assert TurnlogSettings().ready_file == tmp_path / "s.ready"


# --- Who writes it, when ------------------------------------------------------------------------------


def test_a_faust_worker_is_ready_when_a_rebalance_ends_and_not_from_when_one_starts(tmp_path):
    from turnlog.stream_processors.worker import ReadinessSensor

    path = tmp_path / "sequencer.ready"
    sensor = ReadinessSensor(path, "sequencer")
    state = sensor.on_rebalance_start(app=None)
    assert "time_start" in state and not path.exists()  # Faust's own state is kept
    sensor.on_rebalance_end(None, state)
    assert read_ready(path).component == "sequencer"
    sensor.on_rebalance_start(app=None)  # the next rebalance
    assert not path.exists()


class Consumer:
    def __init__(self) -> None:
        self.assigned = None

    def resume(self, partitions) -> None: ...

    def assign(self, partitions) -> None:
        self.assigned = partitions

    def get_watermark_offsets(self, tp, timeout: float, cached: bool) -> tuple[int, int]:
        return 0, 1_000_000  # every stored offset is within the log


def test_the_sink_is_ready_once_assigned_and_not_once_revoked(tmp_path):
    from confluent_kafka import TopicPartition

    from turnlog.sinks.service import SinkService

    path = tmp_path / "analytics.ready"
    service = SinkService(TurnlogSettings(ready_file=path), store=None, write=lambda *a: None,  # type: ignore[arg-type]
                          component="analytics")
    service._claim = lambda partitions: ({("t", 0): 7}, {("t", 0): 1})  # type: ignore[method-assign]
    consumer = Consumer()
    service._seek_to_stored(consumer, [TopicPartition("t", 0)])
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [(0, 7)]  # seeked before it is ready
    assert read_ready(path).component == "analytics"
    service._revoked(consumer, [])
    assert not path.exists()


def test_the_hub_says_when_it_follows_the_topic(monkeypatch):
    from turnlog import follow

    calls = []

    class Offsets:
        def __init__(self, settings) -> None: ...
        def partitions(self, topic: str) -> list[int]:
            return [0, 1]
        def close(self) -> None: ...

    class HubConsumer:
        def assign(self, partitions) -> None:
            calls.append(("assign", len(partitions)))
        def poll(self, timeout: float) -> None:
            hub._stopping.set()
        def close(self) -> None: ...

    monkeypatch.setattr(follow.kafka, "OffsetReader", Offsets)
    monkeypatch.setattr(follow.kafka, "consumer", lambda settings, **config: HubConsumer())
    hub = follow.TranscriptHub(TurnlogSettings(), on_following=lambda: calls.append(("following", 0)))
    hub._run()
    assert calls == [("assign", 4), ("following", 0)]  # the transcript's two partitions and the ledger's two


def test_the_api_without_a_hub_is_ready_at_start_up_and_not_after_shutdown(tmp_path):
    from fastapi.testclient import TestClient

    from turnlog.api import create_app

    path = tmp_path / "api.ready"
    app = create_app(TurnlogSettings(ready_file=path), store=None, live=False)  # type: ignore[arg-type]
    assert not path.exists()
    with TestClient(app):
        assert read_ready(path).component == "api"
    assert not path.exists()


# --- The process runner reads it ------------------------------------------------------------------


def child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


MARK_THEN_WAIT = ("import time; from turnlog.readiness import mark_ready; from turnlog.settings import TurnlogSettings;"
                  " mark_ready(TurnlogSettings().ready_file, 'probe'); time.sleep(60)")


def test_the_runner_waits_for_the_file_its_own_child_writes(tmp_path):
    from turnlog.deploy.processes import ServiceProcess

    ready_path = tmp_path / "probe.ready"
    ready_path.write_text(json.dumps({"component": "probe", "pid": 1, "ready_at": 0.0}))  # left by an earlier process
    process = ServiceProcess("probe", child(MARK_THEN_WAIT), {}, tmp_path / "probe.log", ready_path=ready_path)
    try:
        assert not process.ready()
        mark = process.wait_ready(30)
        assert (mark.component, mark.pid) == ("probe", process.pid) and process.ready()
        process.kill()
        assert ready_path.exists() and not process.ready()  # a SIGKILLed service's file is not readiness
    finally:
        process.stop(5)


def test_a_mark_written_by_another_pid_is_not_the_child_s(tmp_path):
    from turnlog.deploy.processes import ServiceProcess

    ready_path = tmp_path / "probe.ready"
    mark_ready(ready_path, "probe")  # left by an earlier process: removed before the child starts
    process = ServiceProcess("probe", child("import time; time.sleep(60)"), {}, tmp_path / "probe.log",
                             ready_path=ready_path)
    try:
        assert not ready_path.exists()
        mark_ready(ready_path, "probe")  # this test's pid, not the child's
        assert not process.ready()
        with pytest.raises(NotReadyError, match="probe not ready within 0 s; see .*probe.log"):
            process.wait_ready(0.3)
    finally:
        process.stop(5)


def test_a_child_that_exits_before_it_is_ready_fails_the_wait_at_once(tmp_path):
    from turnlog.deploy.processes import ServiceProcess, wait_all_ready

    process = ServiceProcess("probe", child("raise SystemExit(3)"), {}, tmp_path / "probe.log",
                             ready_path=tmp_path / "probe.ready")
    began = time.monotonic()
    with pytest.raises(NotReadyError, match=r"probe exited \(code 3\) before it was ready"):
        wait_all_ready({"probe": process}, 60)
    assert time.monotonic() - began < 30
    process.stop(5)


def test_a_process_without_a_ready_file_gets_none_and_cannot_be_asked(tmp_path, monkeypatch):
    from turnlog.deploy.processes import ServiceProcess

    monkeypatch.setenv("TURNLOG_READY_FILE", str(tmp_path / "parent.ready"))
    out = tmp_path / "env.txt"
    code = f"import os, pathlib; pathlib.Path({str(out)!r}).write_text(os.environ.get('TURNLOG_READY_FILE', 'unset'))"
    process = ServiceProcess("agent", child(code), {"TURNLOG_READY_FILE": "/x"}, tmp_path / "agent.log")
    assert process.popen.wait(30) == 0
    assert out.read_text() == "unset"
    with pytest.raises(ConfigurationError, match="agent was started without a ready file"):
        process.ready()
    process.stop(5)


def test_start_pipeline_gives_each_service_its_own_ready_file_beside_its_log(tmp_path, monkeypatch):
    from turnlog.deploy import processes

    monkeypatch.setattr(processes, "turnlog_command", lambda name: child(MARK_THEN_WAIT))
    started = processes.start_pipeline(TurnlogSettings(), tmp_path, services=("sequencer", "sink"))
    try:
        marks = processes.wait_all_ready(started, 30)
        assert {name: p.ready_path for name, p in started.items()} == {
            "sequencer": tmp_path / "sequencer.ready", "sink": tmp_path / "sink.ready"}
        assert {name: m.pid for name, m in marks.items()} == {name: p.pid for name, p in started.items()}
    finally:
        processes.stop_all(started, 5)


# On SIGTERM: say so in its own file, then drain until the other child said so too (exit 0), or give up (exit 3).
DRAIN_UNTIL_BOTH_TERMINATED = """
import os, signal, sys, time
from pathlib import Path
mine, other = Path(sys.argv[1]), Path(sys.argv[2])
def drain(*_):
    mine.touch()
    deadline = time.monotonic() + 30
    while not other.exists():
        if time.monotonic() > deadline:
            os._exit(3)
        time.sleep(0.01)
    os._exit(0)
signal.signal(signal.SIGTERM, drain)
Path(sys.argv[3]).touch()
while True:
    time.sleep(1)
"""


def test_stop_all_terminates_every_process_before_waiting_for_any(tmp_path):
    """Services drain side by side: each child exits cleanly only once the other one got its SIGTERM
    too, which a stop of one process after the other never gives the first."""
    from turnlog.deploy.processes import ServiceProcess, stop_all

    def start(name: str, other: str) -> ServiceProcess:
        argv = [*child(DRAIN_UNTIL_BOTH_TERMINATED), str(tmp_path / name), str(tmp_path / other), str(tmp_path / f"{name}.up")]
        return ServiceProcess(name, argv, {}, tmp_path / f"{name}.log")

    started = [start("a", "b"), start("b", "a")]
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"{p.name}.up").exists() for p in started):  # both handlers installed
        assert time.monotonic() < deadline, "children did not start"
        time.sleep(0.01)
    stop_all(started, timeout=40)
    assert [p.popen.returncode for p in started] == [0, 0]
