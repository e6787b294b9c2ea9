"""The chaos run's seeded schedule (pure): outages long enough, kills where they can recover."""

from __future__ import annotations

from itertools import pairwise

import pytest

from turnlog.tools.demo.chaos import (
    AFTER_OUTAGE_SECONDS,
    COMPONENTS,
    SERVICE_KILL_WINDOW,
    broker_outage_range,
    build_schedule,
)

SEEDS = range(40)


@pytest.mark.parametrize("delivery_timeout", [20.0, 30.0])
def test_every_120_s_run_has_a_broker_outage_longer_than_the_delivery_timeout_with_agents_killed_during_it(delivery_timeout):
    for seed in SEEDS:
        schedule = build_schedule(seed, 120.0, 25, delivery_timeout)
        [broker] = [o for o in schedule.outages if o.service == "broker"]
        assert 60.0 <= broker.down_seconds <= 120.0
        assert broker.down_seconds >= delivery_timeout + 30.0
        assert broker.method == "sigkill"
        assert len(broker.agent_kills) == 2 and all(0 < t < broker.down_seconds for t in broker.agent_kills)
        assert broker.at + broker.down_seconds <= 120.0


def test_every_run_has_a_postgres_outage_of_20_to_60_s():
    for seed in SEEDS:
        for duration in (120.0, 300.0, 600.0):
            [postgres] = [o for o in build_schedule(seed, duration, 25, 30.0).outages if o.service == "postgres"]
            assert 20.0 <= postgres.down_seconds <= 60.0
            assert postgres.method in ("stop", "sigkill")


def test_outages_never_overlap_and_service_kills_fall_outside_them():
    for seed in SEEDS:
        for duration in (120.0, 300.0, 900.0):
            schedule = build_schedule(seed, duration, 25, 20.0)
            windows = sorted((o.at, o.at + o.down_seconds + AFTER_OUTAGE_SECONDS) for o in schedule.outages)
            assert all(end <= next_start + 0.2 for (_, end), (next_start, _) in pairwise(windows))
            for kill in schedule.kills:
                if kill.component != "agent":
                    assert not any(start <= kill.at < end - 0.05 for start, end in windows), (seed, duration, kill)  # 0.1 s rounding
                    assert kill.at < SERVICE_KILL_WINDOW[1] * duration


def test_longer_runs_get_more_and_longer_outages_and_every_component_is_killed():
    schedule = build_schedule(7, 900.0, 25, 30.0)
    assert [o.service for o in schedule.outages].count("broker") == 2
    assert [o.service for o in schedule.outages].count("postgres") == 2
    assert {k.component for k in schedule.kills} == set(COMPONENTS)
    assert len(schedule.kills) == 25 and schedule.dropped == ()
    assert broker_outage_range(900.0, 30.0) == (60.0, 120.0)
    assert broker_outage_range(120.0, 90.0) == (120.0, 120.0)  # never shorter than the delivery timeout + 30 s


def test_a_short_run_keeps_the_outages_and_drops_the_service_kills_it_has_no_room_for():
    schedule = build_schedule(7, 120.0, 25, 20.0)
    placed = [k.component for k in schedule.kills]
    assert len(placed) + len(schedule.dropped) == 25
    assert schedule.dropped and "agent" not in schedule.dropped
    assert {"sequencer", "sink", "finalizer"} <= set(placed)


def test_the_schedule_is_a_function_of_the_seed():
    assert build_schedule(3, 300.0, 25, 20.0) == build_schedule(3, 300.0, 25, 20.0)
    assert build_schedule(3, 300.0, 25, 20.0) != build_schedule(4, 300.0, 25, 20.0)
