"""The Prometheus alert rules (deploy/observability/alerts.yml) and their promtool unit tests.

``promtool check rules`` validates the rules; ``promtool test rules alerts_test.yml`` runs the
unit tests, in which every alert has a case where it fires and a case where it does not. Each
alert is then broken on purpose (made never to fire, or always to fire) in a copy of the rules,
and the unit tests must fail: a test that cannot catch its alert's breakage is no test.

promtool comes from Debian's ``prometheus`` package (``bash deploy/prometheus.sh install``; CI runs
it before the tests). ``TURNLOG_PROMTOOL`` names another binary.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = ROOT / "deploy" / "observability"
RULES = OBSERVABILITY / "alerts.yml"
RULE_TESTS = OBSERVABILITY / "alerts_test.yml"
DOCS = ROOT / "docs" / "observability.md"


def promtool() -> str:
    """The promtool binary, or a test failure that says how to install it."""
    path = os.environ.get("TURNLOG_PROMTOOL") or shutil.which("promtool") or "/usr/bin/promtool"
    if not os.access(path, os.X_OK):
        pytest.fail(f"promtool not found ({path}): install it with `bash deploy/prometheus.sh install`"
                    " (Debian's prometheus package) or set TURNLOG_PROMTOOL")
    return path


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def rule_cases() -> list[dict[str, Any]]:
    return [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]


ALERT_NAMES = [rule["alert"] for rule in alert_rules()]


def test_promtool_checks_the_rules() -> None:
    result = run_promtool("check", "rules", RULES.name, cwd=OBSERVABILITY)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    result = run_promtool("test", "rules", RULE_TESTS.name, cwd=OBSERVABILITY)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_expected_alerts_are_there() -> None:
    assert set(ALERT_NAMES) >= {
        "TurnlogTargetDown", "TurnlogConsumerLagGrowing", "TurnlogConsumerLagOld", "TurnlogTurnToStoreSlow",
        "TurnlogDeadLettering", "TurnlogRecorderDegraded", "TurnlogSpoolNearlyFull", "TurnlogSessionsNotFinalized",
        "TurnlogSequencerOffsetJump",
    }
    assert len(ALERT_NAMES) == len(set(ALERT_NAMES))


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_every_alert_has_a_firing_and_a_quiet_case(name: str) -> None:
    cases = [case for case in rule_cases() if case["alertname"] == name]
    assert any(case.get("exp_alerts") for case in cases), f"{name}: no unit test where it fires"
    assert any(not case.get("exp_alerts") for case in cases), f"{name}: no unit test where it stays quiet"


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_every_alert_has_a_severity_and_a_runbook_in_the_docs(name: str) -> None:
    rule = next(rule for rule in alert_rules() if rule["alert"] == name)
    assert rule["labels"]["severity"] in {"warning", "critical"}
    annotations = rule["annotations"]
    assert annotations["summary"] and annotations["description"]
    assert annotations["runbook_url"] == f"docs/observability.md#{name.lower()}"
    headings = re.findall(r"^#+ +(\S+) *$", DOCS.read_text(), flags=re.MULTILINE)
    assert name in headings, f"docs/observability.md has no runbook heading '### {name}'"


def test_no_label_or_annotation_names_a_session() -> None:
    """Labels and annotations name partitions, groups, instances; a session id is unbounded and content-adjacent."""
    text = RULES.read_text()
    assert "session_id" not in text
    for rule in alert_rules():
        assert "session" not in " ".join(rule["labels"]).lower()


def broken_copy(tmp_path: Path, name: str, expr: str, *, firing_cases: bool) -> Path:
    """A copy in ``tmp_path`` of the rules, alert ``name``'s expression replaced, and of the unit tests,
    only ``name``'s cases where it fires (``firing_cases``) or only those where it stays quiet."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == name:
                rule["expr"] = expr.format(expr=rule["expr"])
    (tmp_path / RULES.name).write_text(yaml.safe_dump(rules, sort_keys=False))
    tests = yaml.safe_load(RULE_TESTS.read_text())
    kept = []
    for test in tests["tests"]:
        test["alert_rule_test"] = [case for case in test["alert_rule_test"]
                                   if case["alertname"] == name and bool(case.get("exp_alerts")) == firing_cases]
        if test["alert_rule_test"]:
            kept.append(test)
    assert kept, f"{name}: no unit test case to break"
    tests["tests"] = kept
    (tmp_path / RULE_TESTS.name).write_text(yaml.safe_dump(tests, sort_keys=False))
    return tmp_path


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_the_unit_tests_catch_an_alert_that_never_fires(tmp_path: Path, name: str) -> None:
    folder = broken_copy(tmp_path, name, "vector(0) > 1", firing_cases=True)
    result = run_promtool("test", "rules", RULE_TESTS.name, cwd=folder)
    assert result.returncode != 0, f"alerts_test.yml passes with {name} never firing"
    assert f"alertname: {name}," in result.stdout + result.stderr


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_the_unit_tests_catch_an_alert_that_always_fires(tmp_path: Path, name: str) -> None:
    """Every series the expression yields, plus one more (labels of its own): a quiet case must see it fire."""
    folder = broken_copy(tmp_path, name, "({expr}) or vector(1)", firing_cases=False)
    result = run_promtool("test", "rules", RULE_TESTS.name, cwd=folder)
    assert result.returncode != 0, f"alerts_test.yml passes with {name} always firing"
    assert f"alertname: {name}," in result.stdout + result.stderr
