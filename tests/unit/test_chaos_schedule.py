"""The chaos run's seeded schedules (pure): outages long enough, kills where they can recover; in the
cluster mode every fault kind in a 300 s run, never three brokers away at once."""

from __future__ import annotations

from itertools import pairwise

import pytest

from turnlog.tools.demo.schedule import (
    AFTER_OUTAGE_SECONDS,
    BROKER_FAULTS,
    CLUSTER_COMPONENTS,
    CLUSTER_FAULTS,
    COMPONENTS,
    NODES_TAKEN,
    SERVICE_KILL_WINDOW,
    WORKER_PAUSE,
    Schedule,
    broker_outage_range,
    build_cluster_schedule,
    build_schedule,
)

SERVICE_SESSION_TIMEOUT_SECONDS = 10.0  # the sequencer's and the sink's consumer session timeout

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


# -- the cluster mode (turnlog chaos --cluster) ---------------------------------------


def windows_of(schedule: Schedule, kinds: set[str]) -> list[tuple[float, float]]:
    """The planned windows of the faults of ``kinds`` ("postgres": the Postgres outages)."""
    found = [(f.at, f.planned_end) for f in schedule.faults if f.kind in kinds]
    if "postgres" in kinds:
        found += [(o.at, o.at + o.down_seconds + AFTER_OUTAGE_SECONDS) for o in schedule.outages]
    return sorted(found)


def overlapping(windows: list[tuple[float, float]]) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    return [(a, b) for a, b in pairwise(sorted(windows)) if b[0] < a[1] - 0.2]  # 0.1 s rounding of each


@pytest.mark.parametrize("seed", SEEDS)
def test_a_300_s_cluster_run_has_every_fault_kind_and_kills_every_component_but_the_broker(seed):
    schedule = build_cluster_schedule(seed, 300.0, 25)
    assert sorted(f.kind for f in schedule.faults) == sorted(CLUSTER_FAULTS)
    assert [o.service for o in schedule.outages] == ["postgres"]
    assert {k.component for k in schedule.kills} == set(CLUSTER_COMPONENTS)  # no broker kill, no broker outage
    assert len(schedule.kills) + len(schedule.dropped) == 25
    [pause] = [f for f in schedule.faults if f.kind == WORKER_PAUSE]
    assert pause.target in ("sequencer", "sink")


@pytest.mark.parametrize("duration", [300.0, 600.0, 900.0])
def test_cluster_faults_hold_for_their_ranges_and_a_worker_past_its_session_timeout(duration):
    ranges = {"leader_kill": (15, 45), "broker_pause": (30, 90), "two_brokers_down": (30, 60), WORKER_PAUSE: (20, 40)}
    for seed in SEEDS:
        for fault in build_cluster_schedule(seed, duration, 25).faults:
            if fault.kind == "rolling_restart":
                assert fault.hold_seconds == 0  # each step waits for a full ISR instead
            else:
                low, high = ranges[fault.kind]
                assert low <= fault.hold_seconds <= high, (seed, fault)
            if fault.kind == WORKER_PAUSE:
                assert fault.hold_seconds >= 2 * SERVICE_SESSION_TIMEOUT_SECONDS
            assert fault.planned_seconds >= fault.hold_seconds + AFTER_OUTAGE_SECONDS


@pytest.mark.parametrize("duration", [300.0, 900.0])
def test_broker_faults_never_overlap_so_at_most_two_nodes_are_ever_away(duration):
    assert max(NODES_TAKEN.values()) == 2 and set(NODES_TAKEN) == set(BROKER_FAULTS)
    for seed in SEEDS:
        schedule = build_cluster_schedule(seed, duration, 25)
        broker = windows_of(schedule, set(BROKER_FAULTS))
        assert len(broker) == len(BROKER_FAULTS) * max(1, int(duration // 400))
        assert overlapping(broker) == [], seed


@pytest.mark.parametrize("duration", [300.0, 900.0])
def test_pipeline_faults_and_service_kills_keep_out_of_each_other_and_of_two_brokers_down(duration):
    for seed in SEEDS:
        schedule = build_cluster_schedule(seed, duration, 25)
        two_down = windows_of(schedule, {"two_brokers_down"})
        pipeline = windows_of(schedule, {WORKER_PAUSE, "postgres"})
        assert overlapping(pipeline) == [], seed
        assert not any(a < d - 0.2 and c < b - 0.2 for a, b in pipeline for c, d in two_down), seed
        for kill in schedule.kills:
            if kill.component != "agent":
                assert not any(a <= kill.at < b - 0.2 for a, b in pipeline + two_down), (seed, kill)


def test_the_leader_kill_then_two_brokers_down_come_first_while_agents_talk_and_agents_die_during_the_second():
    orders = set()
    for seed in SEEDS:
        schedule = build_cluster_schedule(seed, 300.0, 25)
        broker = [f for f in schedule.faults if f.kind in BROKER_FAULTS]
        assert [f.kind for f in broker[:2]] == ["leader_kill", "two_brokers_down"]
        assert broker[0].at < 0.1 * 300 and broker[1].at < 0.5 * 300  # the agents talk until 0.85 x 300
        orders.add(tuple(f.kind for f in broker[2:]))
        [two_down] = [f for f in broker if f.kind == "two_brokers_down"]
        assert len(two_down.agent_kills) == 2 and all(0 < t < two_down.hold_seconds for t in two_down.agent_kills)
    assert orders == {("broker_pause", "rolling_restart"), ("rolling_restart", "broker_pause")}  # seeded


def test_the_cluster_schedule_is_a_function_of_the_seed_and_names_its_faults_in_json():
    assert build_cluster_schedule(5, 300.0, 25) == build_cluster_schedule(5, 300.0, 25)
    assert build_cluster_schedule(5, 300.0, 25) != build_cluster_schedule(6, 300.0, 25)
    as_json = build_cluster_schedule(5, 300.0, 25).as_json()
    assert sorted(f["kind"] for f in as_json["faults"]) == sorted(CLUSTER_FAULTS)
    assert "faults" not in build_schedule(5, 300.0, 25, 20.0).as_json()  # the single-broker report is unchanged
