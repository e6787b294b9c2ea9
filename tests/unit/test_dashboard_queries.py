"""Every query of the Grafana dashboard, of the alert rules and of the operations page (``/ops``'s
fixed Prometheus queries) names a metric the services export.

The exported names are those of the metrics declared in :mod:`turnlog.metrics` as Prometheus
serves them (a counter ``x`` as ``x_total``; a histogram ``x`` as ``x_bucket``, ``x_sum``,
``x_count``), plus ``up`` (Prometheus' own, per scrape target). The names a query uses are
found by :func:`metric_names`, a PromQL tokenizer that knows enough of the language: strings,
label matchers (but for ``__name__="..."``), range selectors, grouping label lists, ``offset`` durations and numbers are
removed, and of the identifiers left those that are functions (followed by ``(``), aggregation
operators or keywords are dropped; the rest are metric names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

import turnlog.metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "observability" / "grafana-dashboard.json"
RULES = ROOT / "deploy" / "observability" / "alerts.yml"

#: PromQL's aggregation operators, set operators and keywords: identifiers that are not metric names.
KEYWORDS = frozenset({
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
    "and", "or", "unless", "atan2", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "offset", "start", "end", "inf", "nan",
})
#: Series Prometheus itself adds for every target.
PROMETHEUS_SERIES = frozenset({"up"})

_NAME_MATCHER = re.compile(r'__name__\s*=\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\b(?:offset|@)\s*-?[\w.$]+")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)")
_IDENTIFIER = re.compile(r"(?<![\w:$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names PromQL expression ``expr`` selects.

    Raises:
        ValueError: ``expr`` has unbalanced brackets (a half-written query).
    """
    names = set(_NAME_MATCHER.findall(expr))  # {__name__="x"}: the one place a string names a metric
    text = _STRING.sub('""', expr)
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables ($__rate_interval, ${var}) never name metrics
    for pattern in (_MATCHERS, _RANGE, _GROUPING, _OFFSET):
        text = pattern.sub(" ", text)
    if any(bracket in text for bracket in "{}[]") or text.count("(") != text.count(")"):
        raise ValueError(f"unbalanced brackets in {expr!r}")
    text = _NUMBER.sub(" ", text)
    for match in _IDENTIFIER.finditer(text):
        name, call = match.groups()
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def exported_names() -> set[str]:
    """Every series name the services serve: turnlog.metrics' metrics as exposed, and Prometheus' ``up``."""
    names = set(PROMETHEUS_SERIES)
    for metric in vars(turnlog.metrics).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        [family] = metric.describe()  # its name as served, less a counter's _total; its type
        name, kind = family.name, family.type
        names |= {
            "counter": {f"{name}_total"},
            "gauge": {name},
            "histogram": {f"{name}_bucket", f"{name}_sum", f"{name}_count"},
            "summary": {name, f"{name}_sum", f"{name}_count"},
        }.get(kind, {name})
    return names


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """``(where, expr)`` of every query of the dashboard's panels (rows' nested panels too)."""
    def walk(panels: list[dict]) -> Iterator[tuple[str, str]]:
        for panel in panels:
            for target in panel.get("targets", []):
                yield f"dashboard panel {panel['title']!r} {target['refId']}", target["expr"]
            yield from walk(panel.get("panels", []))

    yield from walk(json.loads(DASHBOARD.read_text())["panels"])


def rule_queries() -> Iterator[tuple[str, str]]:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            yield f"alert {rule.get('alert') or rule.get('record')}", rule["expr"]


def ops_queries() -> Iterator[tuple[str, str]]:
    from turnlog.api.ops import PROMETHEUS_QUERIES

    for name, expr in PROMETHEUS_QUERIES.items():
        yield f"/ops query {name}", expr


QUERIES = [*dashboard_queries(), *rule_queries(), *ops_queries()]


def unknown_names(expr: str) -> set[str]:
    return metric_names(expr) - exported_names()


@pytest.mark.parametrize(("where", "expr"), QUERIES, ids=[where for where, _ in QUERIES])
def test_every_query_names_exported_metrics(where: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{where}: no metric name found in {expr!r}"
    assert not names - exported_names(), (
        f"{where}: {sorted(names - exported_names())} not exported by any service"
        " (declared in turnlog/metrics.py, or Prometheus' up)"
    )


def test_the_dashboard_has_the_panels_the_operators_need() -> None:
    used = set().union(*(metric_names(expr) for _, expr in dashboard_queries()))
    for name in ("turnlog_consumer_lag_records", "turnlog_consumer_lag_seconds", "turnlog_sequencer_emitted_total",
                 "turnlog_sink_records_total", "turnlog_sink_turn_to_store_seconds_bucket", "turnlog_dlq_total",
                 "turnlog_spool_events", "turnlog_spool_oldest_unacked_seconds", "turnlog_spool_bytes",
                 "turnlog_spool_max_bytes", "turnlog_recorder_degraded", "turnlog_recorder_sessions_open",
                 "turnlog_resume_seconds_bucket", "turnlog_resume_seconds_count", "turnlog_api_live_streams",
                 "turnlog_finalization_delay_seconds_bucket", "turnlog_finalizer_sessions_unfinalized",
                 "turnlog_finalizer_unfinalized_oldest_seconds", "turnlog_sequencer_reorder_buffer_events",
                 "turnlog_sequencer_gaps_open"):
        assert name in used, f"no dashboard panel shows {name}"


def test_the_dashboard_is_importable() -> None:
    """Grafana's import form: schema version, a ${DS_PROMETHEUS} input every panel and query uses, unique ids."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36
    assert [item["name"] for item in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]


@pytest.mark.parametrize(("expr", "names"), [
    ("up == 0", {"up"}),
    ('sum by (group, partition) (rate(turnlog_dlq_total{stage="sink", reason=~"sch.*"}[5m] offset 1h))',
     {"turnlog_dlq_total"}),
    ("histogram_quantile(0.99, sum by (le) (rate(turnlog_sink_turn_to_store_seconds_bucket[$__rate_interval])))",
     {"turnlog_sink_turn_to_store_seconds_bucket"}),
    ("turnlog_spool_bytes / on (instance) group_left (job) (turnlog_spool_max_bytes > 0) > 1e3",
     {"turnlog_spool_bytes", "turnlog_spool_max_bytes"}),
    ("max_over_time(turnlog_consumer_lag_seconds[10m:1m]) and bool 1 unless count_values(\"v\", up)",
     {"turnlog_consumer_lag_seconds", "up"}),
    ('{__name__="turnlog_spool_events"} or vector(0)', {"turnlog_spool_events"}),
    ("sum without (instance) (turnlog_sequencer_gaps_open) * -Inf + NaN", {"turnlog_sequencer_gaps_open"}),
])
def test_the_tokenizer_finds_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


@pytest.mark.parametrize("expr", [
    "sum(rate(turnlog_sequencer_emited_total[5m]))",  # misspelled
    "histogram_quantile(0.99, sum by (le) (rate(turnlog_sink_turn_to_store_seconds[5m])))",  # histogram without _bucket
    "turnlog_sink_records",  # counter without _total
    "turnlog_spool_bytes / turnlog_spool_capacity_bytes",  # one known, one not
])
def test_a_misspelled_metric_is_caught(expr: str) -> None:
    assert unknown_names(expr)


def test_a_half_written_query_is_refused() -> None:
    with pytest.raises(ValueError):
        metric_names("sum(rate(turnlog_dlq_total[5m])")
