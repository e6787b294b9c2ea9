"""tests/tiers.py: what it reads from pytest's JUnit reports and the summary it prints."""

from pathlib import Path

from tests.tiers import SERVICES, UNIT, CaseResult, TierRun, read_junit, summary

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="tests.unit.test_tiers" name="test_a" time="0.5"/>
  <testcase classname="tests.integration.test_api" name="test_b[x]" time="12.25">
    <failure message="boom"/>
  </testcase>
  <testcase classname="" name="tests.unit.test_tiers" time="0.0"><skipped message="no extra"/></testcase>
</testsuite></testsuites>
"""


def test_a_report_gives_each_test_its_file_name_time_and_outcome(tmp_path: Path) -> None:
    report = tmp_path / "services.xml"
    report.write_text(REPORT)
    assert read_junit(report) == [
        CaseResult("tests/unit/test_tiers.py::test_a", 0.5, "passed"),
        CaseResult("tests/integration/test_api.py::test_b[x]", 12.25, "failed"),
        CaseResult("tests/unit/test_tiers.py", 0.0, "skipped"),
    ]


def test_the_summary_gives_each_tier_and_folder_and_puts_the_slowest_test_first() -> None:
    runs = [
        TierRun(UNIT, 80.4, 0, [CaseResult("tests/unit/test_x.py::test_fast", 0.1, "passed")]),
        TierRun(SERVICES, 600.0, 1, [CaseResult("tests/integration/test_y.py::test_slow", 90.0, "failed"),
                                     CaseResult("tests/crash/test_z.py::test_mid", 30.0, "passed")]),
    ]
    lines = summary(runs, elapsed=650.2).splitlines()
    assert any(line.split()[:3] == ["unit", "80", "1"] and line.endswith("ok") for line in lines)
    assert any(line.split()[:3] == ["services", "600", "2"] and "FAILED (exit 1, 1 failed)" in line for line in lines)
    assert any(line.split() == ["all", "(elapsed)", "650", "3"] for line in lines)  # not the tiers' sum
    assert any(line.split() == ["tests/integration", "1", "90"] for line in lines)
    slowest = lines[lines.index(next(line for line in lines if "slowest" in line)) + 1:]
    assert [line.split()[-1] for line in slowest] == [
        "tests/integration/test_y.py::test_slow", "tests/crash/test_z.py::test_mid", "tests/unit/test_x.py::test_fast"]
