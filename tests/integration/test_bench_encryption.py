"""`turnlog bench`'s encryption phase on the real broker and Postgres, cut to seconds: the
pipeline in clear then sealed (tools/bench/encryption.py, run_encryption), the same small
load offered to each, every turn stored, each variant's databases and topics dropped after."""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import psycopg
import pytest
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from turnlog import kafka
from turnlog.settings import TurnlogSettings
from turnlog.tools.bench.encryption import run_encryption
from turnlog.tools.bench.workload import plan_sessions

from tests.support import wait_until

pytestmark = pytest.mark.integration

SESSIONS = Path(__file__).resolve().parents[2] / "data" / "sessions"


def test_the_pipeline_runs_in_clear_then_sealed_under_the_same_load_and_leaves_nothing_behind(
    kafka_bootstrap, postgres_admin_url, tmp_path
):
    run = uuid.uuid4().hex[:8]
    settings = TurnlogSettings(
        bootstrap_servers=kafka_bootstrap, topic_prefix=f"test-{run}", partitions=3, flush_interval_seconds=0.5,
        sequencer_group=f"test-{run}-sequencer", sink_group=f"test-{run}-sink",
        finalizer_group=f"test-{run}-finalizer", log_level="WARNING", insecure_open_fleets=True,  # as run_bench gives it
    )
    plans = plan_sessions(SESSIONS, 12, 4, run_id=run)

    result = run_encryption(settings, admin_url=SecretStr(postgres_admin_url), plans=plans, run=run, log_dir=tmp_path,
                            rate=40.0, seconds=4.0, speed=10.0, flush_interval=0.5)

    assert [(r["name"], r["encrypted"]) for r in result["runs"]] == [("enc0off", False), ("enc1on", True)]
    for variant in result["runs"]:
        moderate = variant["moderate"]
        assert moderate["turns"] > 0 and moderate["turns_stored"] == moderate["turns"], variant["name"]
        assert moderate["records"] == moderate["events"]  # the sink applied every event offered, none refused
        assert {"sequencer", "sink", "finalizer", "generator"} <= set(moderate["cpu_seconds"])
    # The keyring of the sealed variant is its own, under the run's log folder.
    assert (tmp_path / "enc1on" / "keyring").exists() and not (tmp_path / "enc0off" / "keyring").exists()
    for key in ("moderate_p99_ms", "moderate_measured_us_per_event", "moderate_pipeline_us_per_event"):
        assert math.isfinite(result["on_over_off"][key]) and result["on_over_off"][key] > 0, key
    assert not any(key.startswith("capacity_") for key in result["on"])  # no backlog drained here
    assert len(result["pairs"]) == 1

    admin = make_url(postgres_admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (f"turnlog_bench_{run}_%",))
        assert left.fetchall() == []
    client = kafka.admin(settings)
    wait_until(lambda: not [topic for topic in client.list_topics(timeout=10).topics
                            if topic.startswith(f"test-{run}-enc")],
               timeout=30, what="the variants' topics deleted")
