"""The Prometheus targets file a demo or chaos run writes (tools/demo/scrape_targets.py) and the chaos run's use of it."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from turnlog.tools.demo import chaos
from turnlog.tools.demo.chaos import run as chaos_run
from turnlog.tools.demo.chaos import state
from turnlog.tools.demo.scrape_targets import ScrapeTargets

#: Ports far from deploy/prometheus.sh's and the services' defaults, so a test never meets a real one.
TEST_FIRST_PORT = 27400


def read_targets(path: Path) -> list[dict[str, Any]]:
    groups = json.loads(path.read_text())
    assert isinstance(groups, list)
    return groups


def test_off_without_a_folder(tmp_path: Path) -> None:
    targets = ScrapeTargets(None, "turnlog-chaos")
    assert targets.environment("sink", "sink") == {}
    assert targets.path is None
    targets.close()
    assert list(tmp_path.iterdir()) == []


def test_each_worker_gets_its_own_port_listed_under_its_kind(tmp_path: Path) -> None:
    folder = tmp_path / "targets"
    targets = ScrapeTargets(folder, "turnlog-chaos", first_port=TEST_FIRST_PORT)
    envs = {worker: targets.environment(kind, worker)
            for kind, worker in [("sequencer", "sequencer"), ("sink", "sink"), ("sink", "sink-2"),
                                 ("agent", "s1.run"), ("agent", "s2.run")]}
    ports = {worker: int(env["TURNLOG_METRICS_PORT"]) for worker, env in envs.items()}
    assert len(set(ports.values())) == len(ports)
    assert all(TEST_FIRST_PORT <= port < 32768 for port in ports.values())  # below the ephemeral range

    assert targets.path == folder / "turnlog-chaos.json"
    listed = {group["targets"][0]: group["labels"] for group in read_targets(targets.path)}
    assert listed == {
        f"127.0.0.1:{ports['sequencer']}": {"job": "turnlog-sequencer", "worker": "sequencer"},
        f"127.0.0.1:{ports['sink']}": {"job": "turnlog-sink", "worker": "sink"},
        f"127.0.0.1:{ports['sink-2']}": {"job": "turnlog-sink", "worker": "sink-2"},
        f"127.0.0.1:{ports['s1.run']}": {"job": "turnlog-agent"},  # no session id in a label
        f"127.0.0.1:{ports['s2.run']}": {"job": "turnlog-agent"},
    }
    assert [path.name for path in folder.iterdir()] == ["turnlog-chaos.json"]  # no partial file left

    targets.close()
    assert not targets.path.exists()


def test_a_replacement_keeps_its_workers_port(tmp_path: Path) -> None:
    targets = ScrapeTargets(tmp_path, "turnlog-demo", first_port=TEST_FIRST_PORT)
    first = targets.environment("sink", "sink")
    targets.environment("agent", "s1")
    assert targets.environment("sink", "sink") == first
    assert targets.environment("agent", "s1") == targets.environment("agent", "s1")
    assert targets.path is not None and len(read_targets(targets.path)) == 2


def test_an_ended_agent_is_taken_off_the_list_and_its_port_not_handed_out_again(tmp_path: Path) -> None:
    targets = ScrapeTargets(tmp_path, "turnlog-demo", first_port=TEST_FIRST_PORT)
    ended = targets.environment("agent", "s1")["TURNLOG_METRICS_PORT"]
    targets.environment("sink", "sink")
    targets.remove("s1")
    targets.remove("never-listed")
    assert targets.path is not None
    assert [group["labels"]["job"] for group in read_targets(targets.path)] == ["turnlog-sink"]
    assert targets.environment("agent", "s2")["TURNLOG_METRICS_PORT"] != ended


def test_a_port_in_use_is_skipped(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", TEST_FIRST_PORT + 50))
        taken.listen()
        targets = ScrapeTargets(tmp_path, "turnlog-demo", first_port=TEST_FIRST_PORT + 50)
        port = int(targets.environment("sink", "sink")["TURNLOG_METRICS_PORT"])
    assert port > TEST_FIRST_PORT + 50


class FakeProcess:
    """Stands in for ServiceProcess: records what the run would have started."""

    started: list[FakeProcess] = []

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path, **kwargs: Any) -> None:
        self.name, self.argv, self.env = name, argv, env
        FakeProcess.started.append(self)


def test_the_chaos_run_gives_every_service_worker_and_agent_a_listed_metrics_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnlog.settings import load_settings

    monkeypatch.setattr(state, "ServiceProcess", FakeProcess)
    monkeypatch.setattr(state, "AgentProcess", lambda process, on_line: process)
    FakeProcess.started = []
    sessions = Path(__file__).resolve().parents[2] / "data" / "sessions"
    folder = tmp_path / "targets"
    options = chaos.ChaosOptions(sessions, log_dir=tmp_path, prometheus_targets=folder)
    run = state._Run(load_settings(), options, "targets-test", store=None)
    monkeypatch.setattr(run.scrape_targets, "_next_port", TEST_FIRST_PORT)
    monkeypatch.setattr(run, "background", lambda *args: None)  # no watcher threads on the stand-ins

    run.start_service("sink", "sink", "sink")
    run.start_service("sequencer", "sequencer", "sequencer")
    run.start_service("sink", "sink-30", "sink")  # the sink killed at 30 s and replaced
    session_id = next(iter(run.transcripts))
    run.spawn(session_id)
    run.spawn(session_id, "--resume")

    sink, sequencer, replacement, agent, resumed = FakeProcess.started
    port = {process: process.env["TURNLOG_METRICS_PORT"] for process in FakeProcess.started}
    assert port[replacement] == port[sink] and port[resumed] == port[agent]
    assert len({port[sink], port[sequencer], port[agent]}) == 3
    assert folder / "turnlog-chaos.json" == run.scrape_targets.path
    jobs = {group["targets"][0]: group["labels"]["job"] for group in read_targets(folder / "turnlog-chaos.json")}
    assert jobs == {f"127.0.0.1:{port[sink]}": "turnlog-sink", f"127.0.0.1:{port[sequencer]}": "turnlog-sequencer",
                    f"127.0.0.1:{port[agent]}": "turnlog-agent"}


def test_the_chaos_run_takes_an_agent_off_the_list_when_its_session_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnlog.settings import load_settings

    monkeypatch.setattr(state, "ServiceProcess", FakeProcess)
    monkeypatch.setattr(state, "AgentProcess", lambda process, on_line: process)
    sessions = Path(__file__).resolve().parents[2] / "data" / "sessions"
    options = chaos.ChaosOptions(sessions, log_dir=tmp_path, prometheus_targets=tmp_path / "targets")
    run = state._Run(load_settings(), options, "done-test", store=None)
    monkeypatch.setattr(run.scrape_targets, "_next_port", TEST_FIRST_PORT)
    monkeypatch.setattr(run, "background", lambda *args: None)
    first, second = list(run.transcripts)[:2]
    run.spawn(first)
    agent = run.spawn(second)
    assert len(read_targets(tmp_path / "targets" / "turnlog-chaos.json")) == 2

    class Lines:  # what AgentProcess hands on_line: the process, its name "agent<generation>:<session>"
        process = agent

    run.on_line(Lines(), {"type": "done"})  # type: ignore[arg-type]
    [left] = read_targets(tmp_path / "targets" / "turnlog-chaos.json")
    assert left["labels"] == {"job": "turnlog-agent"}
    assert left["targets"] == [f"127.0.0.1:{run.agents[first].process.env['TURNLOG_METRICS_PORT']}"]


def test_a_chaos_run_without_a_folder_gives_no_metrics_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from turnlog.settings import load_settings

    monkeypatch.setattr(state, "ServiceProcess", FakeProcess)
    monkeypatch.delenv("TURNLOG_METRICS_PORT", raising=False)
    FakeProcess.started = []
    sessions = Path(__file__).resolve().parents[2] / "data" / "sessions"
    run = state._Run(load_settings(), chaos.ChaosOptions(sessions, log_dir=tmp_path), "no-targets", store=None)
    run.start_service("sink", "sink", "sink")
    [sink] = FakeProcess.started
    assert "TURNLOG_METRICS_PORT" not in sink.env
    assert list(tmp_path.glob("**/*.json")) == []


def test_a_run_with_targets_starts_a_listed_lag_exporter_and_none_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnlog.settings import load_settings
    from turnlog.tools.demo import runner

    monkeypatch.setattr(runner, "ServiceProcess", FakeProcess)
    FakeProcess.started = []
    settings = load_settings()
    assert runner.start_lag_exporter(settings, tmp_path, ScrapeTargets(None, "turnlog-demo")) is None
    assert FakeProcess.started == []

    targets = ScrapeTargets(tmp_path / "targets", "turnlog-demo", first_port=TEST_FIRST_PORT)
    exporter = runner.start_lag_exporter(settings, tmp_path, targets)
    assert isinstance(exporter, FakeProcess)
    assert exporter.argv[-1] == "lag-exporter"
    assert targets.path is not None
    [listed] = read_targets(targets.path)
    assert listed == {"targets": [f"127.0.0.1:{exporter.env['TURNLOG_METRICS_PORT']}"],
                      "labels": {"job": "turnlog-lag-exporter", "worker": "lag-exporter"}}


def test_the_chaos_runs_ops_api_is_listed_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from turnlog.settings import load_settings

    monkeypatch.setattr(chaos_run, "ServiceProcess", FakeProcess)
    FakeProcess.started = []
    sessions = Path(__file__).resolve().parents[2] / "data" / "sessions"
    options = chaos.ChaosOptions(sessions, log_dir=tmp_path, prometheus_targets=tmp_path / "targets")
    run = state._Run(load_settings(), options, "ops-test", store=None)
    monkeypatch.setattr(run.scrape_targets, "_next_port", TEST_FIRST_PORT)
    api = chaos_run._start_ops_api(run, TEST_FIRST_PORT - 1)
    assert api.env["TURNLOG_API_PORT"] == str(TEST_FIRST_PORT - 1)
    [listed] = read_targets(tmp_path / "targets" / "turnlog-chaos.json")
    assert listed == {"targets": [f"127.0.0.1:{api.env['TURNLOG_METRICS_PORT']}"],
                      "labels": {"job": "turnlog-api", "worker": "api"}}
