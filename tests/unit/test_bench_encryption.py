"""The encryption phase's parts that need no broker (tools/bench/encryption.py): the in-process
cost of sealing and opening on the workload's events, a variant's settings in each mode, and the
table rows; the option and the command line that run the phase."""

import math
import stat
from pathlib import Path

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from turnlog.crypto.config import event_opener, recorder_kek
from turnlog.crypto.keys import create_keyring_file, public_key_text
from turnlog.settings import TurnlogSettings
from turnlog.tools.bench.encryption import encryption_cost, encryption_settings
from turnlog.tools.bench.options import BenchOptions
from turnlog.tools.bench.table import ENCRYPTION_TARGET_RATIO, encryption_rows
from turnlog.tools.bench.variants import on_over_off
from turnlog.tools.bench.workload import encoded_events, plan_sessions

SESSIONS = Path(__file__).resolve().parents[2] / "data" / "sessions"


@pytest.fixture(scope="module")
def payloads():
    plans = plan_sessions(SESSIONS, 6, 4, run_id="unit")
    return encoded_events(plans, flush_interval=0.5, speed=10.0)


def test_the_cost_measures_each_side_on_and_off_over_the_same_events(payloads):
    cost = encryption_cost(payloads, rounds=1, batch=50)
    assert cost["events"] == len(payloads) and cost["epochs"] == 6  # one epoch per session
    # A sealed record carries its box (base64) and its epoch's wrapped data key: it is larger.
    assert cost["sealed_bytes_per_event"] > cost["plain_bytes_per_event"] + 80
    assert cost["bytes_on_over_off"] == pytest.approx(cost["sealed_bytes_per_event"] / cost["plain_bytes_per_event"])
    for side in ("recorder", "reader", "sink_plan"):
        # On does everything off does, and encrypts or decrypts besides.
        assert cost[f"{side}_on_us"] > cost[f"{side}_off_us"] > 0, side
        assert cost[f"{side}_on_over_off"] == pytest.approx(cost[f"{side}_on_us"] / cost[f"{side}_off_us"])
    assert cost["wrap_us_per_epoch"] > 0 and math.isfinite(cost["unwrap_us_per_epoch"])
    assert cost["added_us_per_event"] == pytest.approx(
        cost["recorder_on_us"] - cost["recorder_off_us"] + cost["sink_plan_on_us"] - cost["sink_plan_off_us"])


def test_a_variant_on_has_a_keyring_of_its_own_and_seals_and_off_never_seals(tmp_path):
    # The run's settings may name a keyring of their own (a deployment's): neither variant uses it.
    deployment = tmp_path / "deployment-keyring"
    create_keyring_file(deployment)
    run = TurnlogSettings(topic_prefix="bench-r", keyring_file=str(deployment))

    on = encryption_settings(run, True, tmp_path / "enc0on" / "keyring")
    assert on.encryption == "required" and on.keyring_file == str(tmp_path / "enc0on" / "keyring")
    assert stat.S_IMODE((tmp_path / "enc0on" / "keyring").stat().st_mode) == 0o600
    kek = recorder_kek(on)
    opener = event_opener(on)
    assert kek is not None and opener is not None and opener.ring.ids == (kek.id,)
    assert on.kek_public_key == public_key_text(kek.key)  # the children get it, not an inherited one
    assert on.as_environment()["TURNLOG_ENCRYPTION"] == "required"

    off = encryption_settings(run, False, tmp_path / "enc0off" / "keyring")
    assert off.encryption == "off" and off.keyring_file is None and off.kek_public_key is None
    assert recorder_kek(off) is None and not (tmp_path / "enc0off").exists()
    assert off.as_environment()["TURNLOG_ENCRYPTION"] == "off"
    assert run.keyring_file == str(deployment)  # copies: the run's own settings unchanged


def _pooled(p99: float, measured: float, sequencer: float) -> dict:
    return {"moderate_offered_events_per_second": 700.0, "moderate_p50_ms": p99 / 4, "moderate_p95_ms": p99 / 2,
            "moderate_p99_ms": p99, "moderate_complete_turn_p99_ms": 40.0, "moderate_turns": 300,
            "moderate_measured_us_per_event": measured, "moderate_pipeline_us_per_event": measured / 2,
            "moderate_sequencer_us_per_event": sequencer, "moderate_sink_us_per_event": 300.0,
            "moderate_generator_us_per_event": 400.0}


def test_the_table_shows_the_cost_then_off_to_on_under_load_with_the_ratios_and_the_target():
    off, on = _pooled(200.0, 2000.0, 500.0), _pooled(210.0, 2100.0, 550.0)
    cost = {"added_us_per_event": 46.5, "recorder_off_us": 7.5, "recorder_on_us": 29.2, "recorder_on_over_off": 3.89,
            "reader_off_us": 6.4, "reader_on_us": 26.2, "sink_plan_off_us": 14.7, "sink_plan_on_us": 39.6,
            "wrap_us_per_epoch": 104.0, "unwrap_us_per_epoch": 84.0, "plain_bytes_per_event": 471.0,
            "sealed_bytes_per_event": 724.0, "bytes_on_over_off": 1.54, "added_share_of_pipeline_cpu": 0.25}
    report = {"encryption_cost": cost,
              "encryption": {"repetitions": 1, "on": on, "off": off, "on_over_off": on_over_off(on, off)}}
    rows = encryption_rows(report)
    assert [name for name, _, _ in rows] == [
        "encryption on vs off, per event", "encryption on vs off, bytes per event",
        "encryption off -> on: at 700 ev/s", "encryption off -> on: CPU at 700 ev/s"]
    assert rows[0][1] == "+46.5 µs CPU/event" and "25.0% of the pipeline's CPU/event at capacity" in rows[0][2]
    assert rows[1][1] == "471 -> 724 B"
    assert rows[2][1] == "p99 200.0 -> 210.0 ms (1.05 x)"
    assert rows[3][1] == "2,000 -> 2,100 µs/event (1.05 x)"
    assert "sequencer 500 -> 550 µs (1.10 x)" in rows[3][2]
    assert f"<= {ENCRYPTION_TARGET_RATIO:.2f}" in rows[2][2]
    # An in-process figure alone (--only encryption measures no capacity): no share of it.
    alone = encryption_rows({"encryption_cost": {**cost, "added_share_of_pipeline_cpu": float("nan")}})
    assert len(alone) == 2 and "capacity" not in alone[0][2]
    failed = encryption_rows({"encryption_cost": cost, "encryption": {"error": "RuntimeError: x"}})
    assert failed[-1] == ("encryption on vs off under load", "not measured", "RuntimeError: x")
    assert encryption_rows({}) == []


def test_the_command_line_runs_the_phase_alone_and_refuses_an_unknown_one(monkeypatch):
    from turnlog import cli

    seen: list[BenchOptions] = []
    monkeypatch.setattr("turnlog.tools.bench.runner.run_bench", lambda settings, options: seen.append(options))
    url = "postgresql+psycopg://u:p@127.0.0.1:5433/turnlog"
    result = CliRunner().invoke(cli.app, ["bench", "--database-url", url, "--only", "encryption",
                                          "--encryption-repetitions", "2"])
    assert result.exit_code == 0, result.output
    assert seen[0].only == "encryption" and seen[0].encryption_repetitions == 2
    assert seen[0].admin_url == SecretStr(url)
    refused = CliRunner().invoke(cli.app, ["bench", "--database-url", url, "--only", "capacity"])
    assert refused.exit_code == 2 and len(seen) == 1
