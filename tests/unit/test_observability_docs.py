"""docs/observability.md's metrics table and turnlog/metrics.py say the same.

Every metric declared in :mod:`turnlog.metrics` has one row (its name as served: a counter with
``_total``, a histogram by its base name), with the right type and labels; every row names a
declared metric. Its alerts table lists exactly the alerts of deploy/observability/alerts.yml.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

import turnlog.metrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "observability.md"
RULES = ROOT / "deploy" / "observability" / "alerts.yml"


def declared() -> dict[str, tuple[str, tuple[str, ...]]]:
    """``{served name: (type, label names)}`` of every metric declared in turnlog.metrics."""
    metrics = {}
    for metric in vars(turnlog.metrics).values():
        if isinstance(metric, MetricWrapperBase):
            [family] = metric.describe()  # its name as served, less a counter's _total; its type
            name = family.name + ("_total" if family.type == "counter" else "")
            metrics[name] = (family.type, tuple(metric._labelnames))  # no public accessor for the label names
    return metrics


def table_rows(first_header: str) -> list[list[str]]:
    """The cells of the Markdown table whose header row starts with ``| first_header |``."""
    lines = DOCS.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = {}
    for name, kind, labels, *_ in table_rows("Metric"):
        match = re.fullmatch(r"`([a-z_:][a-z0-9_:]*)`", name)
        assert match, f"docs/observability.md: {name!r} is not a `metric_name`"
        assert match.group(1) not in rows, f"docs/observability.md: {name} has two rows"
        rows[match.group(1)] = (kind, tuple(label.strip() for label in labels.split(",") if label.strip()))
    return rows


def test_turnlog_metrics_declares_metrics() -> None:
    assert len(declared()) >= 30


def test_every_declared_metric_has_a_row() -> None:
    missing = sorted(set(declared()) - set(documented()))
    assert not missing, f"declared in turnlog/metrics.py but not in docs/observability.md's table: {missing}"


def test_every_row_is_a_declared_metric() -> None:
    extra = sorted(set(documented()) - set(declared()))
    assert not extra, f"in docs/observability.md's table but not declared in turnlog/metrics.py: {extra}"


@pytest.mark.parametrize("name", sorted(declared()))
def test_each_row_gives_the_declared_type_and_labels(name: str) -> None:
    if name not in documented():
        pytest.skip("no row (test_every_declared_metric_has_a_row fails)")
    assert documented()[name] == declared()[name]


def test_every_row_says_unit_exporter_and_meaning() -> None:
    for row in table_rows("Metric"):
        assert len(row) == 6, row
        name, _, _, unit, exported_by, meaning = row
        assert unit and exported_by and meaning, f"{name}: unit, exporter or meaning missing"


def test_the_alerts_table_lists_every_alert() -> None:
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"]
              for rule in group["rules"] if "alert" in rule}
    listed = {row[0].strip("`") for row in table_rows("Alert")}
    assert listed == alerts
