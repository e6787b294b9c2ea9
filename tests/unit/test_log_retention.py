"""The start-time check of the log's retention against the store's policy and the erasure deadline
(turnlog/kafka/log_retention.py), the retention settings' validation, and the sink's warning."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from turnlog.kafka.log_retention import (
    MS_PER_DAY,
    LogOutlivesPolicy,
    PolicyLimit,
    log_outlives_policy,
    retention_policy_ms,
)
from turnlog.settings import TurnlogSettings
from turnlog.sinks import erasure_ledger, open_store
from turnlog.sinks.erasure_ledger import ErasureDuties

DAY = MS_PER_DAY


def settings(**overrides: object) -> TurnlogSettings:
    """Settings whose three topics keep 2 days and whose erasure deadline is 30 days, unless overridden."""
    return TurnlogSettings(topic_prefix="t", **{"events_retention_ms": 2 * DAY, "transcript_retention_ms": 2 * DAY,
                                                 "dlq_retention_ms": 2 * DAY, **overrides})


def by_topic(findings: list[LogOutlivesPolicy]) -> dict[tuple[str, str], LogOutlivesPolicy]:
    return {(finding.topic, finding.source): finding for finding in findings}


def test_the_defaults_keep_nothing_past_the_erasure_deadline():
    assert log_outlives_policy(TurnlogSettings(topic_prefix="t")) == []


def test_topics_within_every_limit_give_no_finding():
    assert log_outlives_policy(settings(retention_days=2, retention_days_by_fleet={"a": 3})) == []


def test_a_topic_longer_than_the_shortest_fleet_policy_is_found_with_the_value_to_set():
    found = log_outlives_policy(settings(retention_days=10, retention_days_by_fleet={"brief": 1, "long": 90},
                                         transcript_retention_ms=7 * DAY))
    assert retention_policy_ms(settings(retention_days=10, retention_days_by_fleet={"brief": 1})) == DAY
    # Every topic keeps 2 days or more, the brief fleet's policy is 1 day: all three outlive it.
    assert [(f.topic, f.setting, f.source, f.retention_ms, f.limit, f.limit_ms) for f in found] == [
        ("t.events", "events_retention_ms", "settings", 2 * DAY, PolicyLimit.RETENTION_POLICY, DAY),
        ("t.transcript", "transcript_retention_ms", "settings", 7 * DAY, PolicyLimit.RETENTION_POLICY, DAY),
        ("t.dlq", "dlq_retention_ms", "settings", 2 * DAY, PolicyLimit.RETENTION_POLICY, DAY),
    ]
    assert found[1].environment_variable == "TURNLOG_TRANSCRIPT_RETENTION_MS"
    assert not found[1].forever


def test_without_a_policy_the_erasure_deadline_is_the_limit():
    found = log_outlives_policy(settings(erasure_deadline_days=1.5, events_retention_ms=3 * DAY))
    assert [(f.topic, f.limit, f.limit_ms) for f in found] == [
        ("t.events", PolicyLimit.ERASURE_DEADLINE, int(1.5 * DAY)),
        ("t.transcript", PolicyLimit.ERASURE_DEADLINE, int(1.5 * DAY)),
        ("t.dlq", PolicyLimit.ERASURE_DEADLINE, int(1.5 * DAY)),
    ]


def test_a_policy_longer_than_the_deadline_leaves_the_deadline_as_the_limit():
    found = log_outlives_policy(settings(retention_days=60, erasure_deadline_days=1, dlq_retention_ms=DAY))
    assert {(f.topic, f.limit, f.limit_ms) for f in found} == {
        ("t.events", PolicyLimit.ERASURE_DEADLINE, DAY), ("t.transcript", PolicyLimit.ERASURE_DEADLINE, DAY),
    }


def test_a_topic_kept_forever_always_outlives_the_policy():
    found = by_topic(log_outlives_policy(settings(retention_days=36_500, erasure_deadline_days=36_500,
                                                  events_retention_ms=-1)))
    assert list(found) == [("t.events", "settings")]
    assert found["t.events", "settings"].forever


def test_the_brokers_values_are_compared_where_they_differ_from_the_settings():
    broker = {"t.events": 2 * DAY, "t.transcript": -1, "t.dlq": 40 * DAY, "t.other": -1}
    found = by_topic(log_outlives_policy(settings(retention_days=3), broker))
    # The events topic is as the settings ask (no finding twice); the others outlive 3 days on the broker.
    assert sorted(found) == [("t.dlq", "broker"), ("t.transcript", "broker")]
    assert found["t.transcript", "broker"].forever
    assert (found["t.dlq", "broker"].retention_ms, found["t.dlq", "broker"].limit_ms) == (40 * DAY, 3 * DAY)


def test_a_broker_value_equal_to_a_too_long_setting_is_one_finding():
    found = log_outlives_policy(settings(retention_days=1), {"t.events": 2 * DAY})
    assert [(f.topic, f.source) for f in found] == [("t.events", "settings"), ("t.transcript", "settings"),
                                                   ("t.dlq", "settings")]


@pytest.mark.parametrize("by_fleet", [{"*": 3}, {"": 3}, {"a\x00b": 3}, {"x" * 201: 3}, {"a": 0}, {"a": -2},
                                      {"a": float("nan")}, {"a": 36_501}])
def test_retention_by_fleet_refuses_bad_fleets_and_days(by_fleet):
    with pytest.raises(ValidationError) as refused:
        TurnlogSettings(retention_days_by_fleet=by_fleet)
    assert [error["loc"] for error in refused.value.errors()] == [("retention_days_by_fleet",)]


@pytest.mark.parametrize("days", [0, -1, 36_501])
def test_retention_days_refuses_days_out_of_range(days):
    with pytest.raises(ValidationError) as refused:
        TurnlogSettings(retention_days=days)
    assert [error["loc"] for error in refused.value.errors()] == [("retention_days",)]


def test_retention_by_fleet_from_the_environment(monkeypatch):
    monkeypatch.setenv("TURNLOG_RETENTION_DAYS_BY_FLEET", '{"calls": 30, "brief": 0.5}')
    assert TurnlogSettings().retention_days_by_fleet == {"calls": 30.0, "brief": 0.5}


def test_the_sink_warns_at_start_for_each_finding(tmp_path, caplog):
    duties = ErasureDuties(settings(retention_days=1), open_store(f"sqlite:///{tmp_path / 'store.db'}"))
    with caplog.at_level(logging.WARNING, logger="turnlog.sinks.erasure_ledger"):
        findings = duties.warn_if_log_outlives_policy()
    assert [f.topic for f in findings] == ["t.events", "t.transcript", "t.dlq"]
    assert [record.levelno for record in caplog.records] == [logging.WARNING] * 3


def test_the_sink_sweeps_once_a_sweep_interval_and_sooner_while_batches_fill(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(erasure_ledger, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    duties = ErasureDuties(settings(retention_days=1), open_store(f"sqlite:///{tmp_path / 'store.db'}"),
                           interval=5, sweep_interval=60)
    results = iter([["s"] * erasure_ledger.SWEEP_BATCH, ["s"], [], [], []])
    sweeps: list[float] = []
    published: list[float] = []
    monkeypatch.setattr(duties, "sweep_retention", lambda: sweeps.append(clock[0]) or next(results))
    monkeypatch.setattr(duties, "publish_pending", lambda: published.append(clock[0]) or 0)
    for second in range(1000, 1200):
        clock[0] = float(second)
        duties.run_if_due()
    # A full batch sweeps again at the next round (5 s); otherwise once a minute.
    assert sweeps == [1000, 1005, 1065, 1125, 1185]
    assert published == list(range(1000, 1200, 5))


@pytest.mark.parametrize("days", [0, float("inf"), float("nan"), 36_501])
def test_the_erasure_deadline_refuses_days_no_topic_config_can_say(days):
    with pytest.raises(ValidationError) as refused:
        TurnlogSettings(erasure_deadline_days=days)
    assert [error["loc"] for error in refused.value.errors()] == [("erasure_deadline_days",)]
