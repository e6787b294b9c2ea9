"""deploy/prometheus.sh runs a Prometheus that loads turnlog's alert rules and scrapes what a
file_sd targets file lists (the way a demo or chaos run's ``--prometheus-targets`` feeds it).

A real Prometheus (Debian's package: ``bash deploy/prometheus.sh install``) on a free port with a
state folder of the test's own; the scraped target is a metrics endpoint in this process serving
turnlog.metrics' registry, and a second target is a port nobody listens on.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import REGISTRY, start_http_server

import turnlog.metrics  # noqa: F401  (its metrics are what the endpoint serves)

from tests.support import wait_until

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "prometheus.sh"
RULES = ROOT / "deploy" / "observability" / "alerts.yml"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[dict[str, str], str]]:
    """The script's environment and the server's URL; the server is stopped at the end."""
    if not (os.environ.get("TURNLOG_PROMTOOL") or shutil.which("promtool") or Path("/usr/bin/promtool").exists()):
        pytest.fail("promtool not found: install it with `bash deploy/prometheus.sh install`")
    port = free_port()
    env = {**os.environ, "TURNLOG_STATE_DIR": str(tmp_path / "state"), "TURNLOG_PROMETHEUS_PORT": str(port)}
    try:
        yield env, f"http://127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60, check=False)


def script(env: dict[str, str], command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), command], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def api(url: str, path: str, **params: str) -> Any:
    answer = httpx.get(f"{url}/api/v1/{path}", params=params, timeout=5)
    answer.raise_for_status()
    return answer.json()["data"]


def test_start_loads_the_rules_and_scrapes_the_targets_files(prometheus: tuple[dict[str, str], str]) -> None:
    env, url = prometheus
    server, thread = start_http_server(free_port(), addr="127.0.0.1", registry=REGISTRY)
    try:
        started = script(env, "start")
        assert started.returncode == 0, started.stderr
        pid = (Path(env["TURNLOG_STATE_DIR"]) / "prometheus" / "prometheus.pid").read_text().strip()

        alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
        loaded = {rule["name"] for group in api(url, "rules")["groups"] for rule in group["rules"]}
        assert loaded == alerts

        up, down = f"127.0.0.1:{server.server_port}", f"127.0.0.1:{free_port()}"
        targets = Path(env["TURNLOG_STATE_DIR"]) / "prometheus" / "targets" / "test.json"
        targets.write_text(json.dumps([{"targets": [up], "labels": {"job": "turnlog-sink"}},
                                       {"targets": [down], "labels": {"job": "turnlog-agent"}}]))

        def health() -> dict[str, tuple[str, str]] | None:
            found = {target["labels"]["instance"]: (target["labels"]["job"], target["health"])
                     for target in api(url, "targets")["activeTargets"]}
            return found if all(health != "unknown" for _, health in found.values()) and len(found) == 2 else None

        assert wait_until(health, timeout=60, what="both targets scraped", interval=0.5) == {
            up: ("turnlog-sink", "up"), down: ("turnlog-agent", "down")
        }
        series = wait_until(lambda: api(url, "query", query='turnlog_spool_max_bytes{job="turnlog-sink"}')["result"],
                            timeout=30, what="a turnlog metric scraped", interval=0.5)
        assert series[0]["metric"]["instance"] == up

        again = script(env, "start")  # idempotent: the same server, its configuration reloaded
        assert again.returncode == 0, again.stderr
        assert (Path(env["TURNLOG_STATE_DIR"]) / "prometheus" / "prometheus.pid").read_text().strip() == pid
        assert script(env, "status").returncode == 0
    finally:
        server.shutdown()
        thread.join(10)
    assert script(env, "stop").returncode == 0
    assert script(env, "status").returncode == 3
    assert script(env, "stop").returncode == 0  # stopping a stopped server is not an error


def test_every_query_of_the_dashboard_the_alerts_and_ops_is_valid_promql(
    prometheus: tuple[dict[str, str], str]
) -> None:
    """The real PromQL parser accepts each query (the unit test checks the metric names, not the syntax)."""
    from tests.unit.test_dashboard_queries import QUERIES

    env, url = prometheus
    started = script(env, "start")
    assert started.returncode == 0, started.stderr
    refused = {}
    for where, expr in QUERIES:
        answer = httpx.get(f"{url}/api/v1/query", params={"query": expr.replace("$__rate_interval", "1m")}, timeout=5)
        if answer.status_code != 200 or answer.json()["status"] != "success":
            refused[where] = answer.json().get("error")
    assert not refused
    assert len(QUERIES) > 40


def test_start_refuses_a_port_someone_else_holds(prometheus: tuple[dict[str, str], str]) -> None:
    env, _ = prometheus
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", int(env["TURNLOG_PROMETHEUS_PORT"])))
        holder.listen()
        assert script(env, "start").returncode != 0
    assert script(env, "status").returncode == 3
