"""The seeded schedules of ``turnlog chaos`` (pure): what is killed, stopped or paused, and when.

Two modes. The single-broker mode (:func:`build_schedule`) SIGKILLs agents and
every service, the broker included, and takes the broker and Postgres down for
long outages. The cluster mode (:func:`build_cluster_schedule`, ``turnlog chaos
--cluster``, on the local 3-node KRaft cluster) replaces the broker's kill and
outage with the cluster's faults (``CLUSTER_FAULTS``) and pauses a pipeline worker.
Times are seconds from the start of the run.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = [
    "COMPONENTS",
    "CLUSTER_COMPONENTS",
    "BROKER_FAULTS",
    "CLUSTER_FAULTS",
    "NODES_TAKEN",
    "PlannedKill",
    "PlannedOutage",
    "PlannedFault",
    "Schedule",
    "build_schedule",
    "build_cluster_schedule",
    "broker_outage_range",
    "postgres_outage_range",
    "hold_range",
]

COMPONENTS = ("agent", "sequencer", "sink", "finalizer", "broker")
#: Outages happen in this part of the run (fractions of ``duration``): while the agents talk.
OUTAGE_WINDOW = (0.05, 0.85)
#: Service kills happen in this part, outside outages: the pipeline may still drain a backlog at the end.
SERVICE_KILL_WINDOW = (0.05, 1.0)
SERVICE_KILL_SPACING_SECONDS = 6.0
AFTER_OUTAGE_SECONDS = 5.0  # left free after an outage for the restarted service to settle
BROKER_OUTAGE_SECONDS = (60.0, 120.0)
POSTGRES_OUTAGE_SECONDS = (20.0, 60.0)
OUTAGE_AGENT_KILL_WINDOW = (0.15, 0.75)  # fractions of a broker outage's length

# -- the cluster mode --
#: SIGKILLed in the cluster mode: the brokers' faults are CLUSTER_FAULTS instead.
CLUSTER_COMPONENTS = ("agent", "sequencer", "sink", "finalizer")
#: On the brokers, one after the other: the busiest events leader SIGKILLed (restarted after
#: its hold); every node restarted in turn, each step once the ISR is full again; one node
#: SIGSTOPped for its hold, then SIGCONTed; two nodes SIGKILLed for their hold (below min ISR
#: 2; in the combined-mode cluster also the controller quorum lost), then started.
BROKER_FAULTS = ("leader_kill", "rolling_restart", "broker_pause", "two_brokers_down")
#: A sequencer or sink worker SIGSTOPped past its group's 10 s session timeout, then SIGCONTed.
WORKER_PAUSE = "worker_pause"
CLUSTER_FAULTS = (*BROKER_FAULTS, WORKER_PAUSE)
#: Nodes each broker fault takes away at most: never 3, and broker faults never overlap.
NODES_TAKEN = {"leader_kill": 1, "rolling_restart": 1, "broker_pause": 1, "two_brokers_down": 2}
#: Each fault's hold (seconds): the whole range in runs of ``FULL_RANGE_DURATION`` or longer,
#: its lower part in shorter ones (:func:`hold_range`). A worker's hold is past its 10 s session timeout.
HOLD_SECONDS = {
    "leader_kill": (15.0, 45.0),
    "rolling_restart": (0.0, 0.0),
    "broker_pause": (30.0, 90.0),
    "two_brokers_down": (30.0, 60.0),
    WORKER_PAUSE: (20.0, 40.0),
}
FULL_RANGE_DURATION = 600.0
#: What the plan leaves a fault after its hold to recover (restart, full ISR, the pipeline caught
#: up); a rolling restart's whole length. Measured on the 2-core dev machine under the chaos
#: load: a restarted node's ISR full 45 to 75 s after its start, a rolling restart 45 to 130 s.
#: The run waits for the real recovery before the next broker fault, so a fault that recovers
#: later only moves the next ones.
EXPECTED_RECOVERY_SECONDS = {
    "leader_kill": 60.0,
    "rolling_restart": 90.0,
    "broker_pause": 20.0,
    "two_brokers_down": 60.0,
    WORKER_PAUSE: 15.0,
}
#: Each round's broker faults start with these, in this order, while the most agents talk: the
#: leader kill under the heaviest load, then two brokers down (its agent kills need agents in
#: the middle of a turn); the others follow in a seeded order.
BROKER_FAULTS_FIRST = ("leader_kill", "two_brokers_down")
#: Broker faults happen in this part of the run (fractions of ``duration``).
BROKER_FAULT_WINDOW = (0.03, 0.95)


@dataclass(frozen=True, slots=True)
class PlannedKill:
    at: float  # seconds after the start of the run
    component: str  # one of COMPONENTS


@dataclass(frozen=True, slots=True)
class PlannedOutage:
    at: float  # seconds after the start of the run
    service: str  # "broker" or "postgres"
    down_seconds: float
    method: str  # "sigkill" or "stop"
    agent_kills: tuple[float, ...] = ()  # seconds after ``at``: agents SIGKILLed while it is down


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """A fault of the cluster mode (:func:`build_cluster_schedule`): one of ``CLUSTER_FAULTS``."""

    at: float  # seconds after the start of the run
    kind: str  # one of CLUSTER_FAULTS
    #: seconds the node(s) stay down or stopped, or the worker stopped (0 for a rolling restart: its steps wait)
    hold_seconds: float
    #: seconds from ``at`` the plan leaves to it: the hold, the recovery it expects
    #: (``EXPECTED_RECOVERY_SECONDS``) and ``AFTER_OUTAGE_SECONDS``. The run waits for the real recovery.
    planned_seconds: float
    target: str = ""  # a worker pause: the service ("sequencer" or "sink") one of whose workers is stopped
    agent_kills: tuple[float, ...] = ()  # seconds after ``at``: agents SIGKILLed while it is held

    @property
    def planned_end(self) -> float:
        return self.at + self.planned_seconds


@dataclass(frozen=True, slots=True)
class Schedule:
    kills: tuple[PlannedKill, ...]
    outages: tuple[PlannedOutage, ...]
    #: components of requested kills left out: no room outside the outages
    dropped: tuple[str, ...] = ()
    #: the cluster mode's faults (none in the single-broker mode)
    faults: tuple[PlannedFault, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return msgspec.to_builtins({
            "kills": list(self.kills), "outages": list(self.outages), "dropped": list(self.dropped),
            **({"faults": list(self.faults)} if self.faults else {}),
        })


def broker_outage_range(duration: float, delivery_timeout: float) -> tuple[float, float]:
    """Shortest and longest broker outage (seconds): 60 to 120 s scaled to the
    run, and never shorter than the delivery timeout + 30 s."""
    low = max(BROKER_OUTAGE_SECONDS[0], delivery_timeout + 30.0)
    return low, max(low, min(BROKER_OUTAGE_SECONDS[1], 0.5 * duration))


def postgres_outage_range(duration: float) -> tuple[float, float]:
    """Shortest and longest Postgres outage (seconds): 20 to 60 s scaled to the run."""
    low = POSTGRES_OUTAGE_SECONDS[0]
    return low, max(low, min(POSTGRES_OUTAGE_SECONDS[1], 0.2 * duration))


def build_schedule(
    seed: int, duration: float, kills: int, delivery_timeout: float, *, outage_agent_kills: int = 2
) -> Schedule:
    """The seeded plan of a chaos run of ``duration`` seconds.

    - Outages: one broker outage and one Postgres outage per full 400 s (at
      least one of each), in a seeded order with seeded gaps inside
      ``OUTAGE_WINDOW``, never overlapping each other, each followed by
      ``AFTER_OUTAGE_SECONDS`` free. Each broker outage SIGKILLs
      ``outage_agent_kills`` agents while it is down.
    - ``kills`` instant SIGKILLs, in seeded rounds over ``COMPONENTS``. Agent
      kills are spread over ``OUTAGE_WINDOW`` (an agent may be killed during a
      Postgres outage too). Service and broker kills go to slots
      ``SERVICE_KILL_SPACING_SECONDS`` apart in ``SERVICE_KILL_WINDOW`` outside
      the outages, in round order; those with no slot left are dropped (named
      in ``dropped``).
    """
    rng = random.Random(seed)
    start, end = (f * duration for f in OUTAGE_WINDOW)
    rounds = max(1, int(duration // 400))
    outages: list[tuple[str, float, str]] = []
    for _ in range(rounds):
        outages.append(("broker", rng.uniform(*broker_outage_range(duration, delivery_timeout)), "sigkill"))
        outages.append(("postgres", rng.uniform(*postgres_outage_range(duration)), rng.choice(("stop", "sigkill"))))
    rng.shuffle(outages)
    starts = _placed(rng, [down + AFTER_OUTAGE_SECONDS for _, down, _ in outages], start, end)
    planned: list[PlannedOutage] = []
    for (service, down, method), at in zip(outages, starts, strict=True):
        agent_kills: tuple[float, ...] = ()
        if service == "broker":
            agent_kills = tuple(
                sorted(round(rng.uniform(*OUTAGE_AGENT_KILL_WINDOW) * down, 1) for _ in range(outage_agent_kills))
            )
        planned.append(PlannedOutage(round(at, 1), service, round(down, 1), method, agent_kills))

    order = [c for _ in range(kills // len(COMPONENTS) + 1) for c in rng.sample(COMPONENTS, len(COMPONENTS))][:kills]
    planned_kills = _agent_kills(rng, order.count("agent"), start, end)
    slots = _free_slots([(o.at, o.at + o.down_seconds + AFTER_OUTAGE_SECONDS) for o in planned],
                        *(f * duration for f in SERVICE_KILL_WINDOW))
    placed, dropped = _service_kills(order, slots)
    return Schedule(tuple(sorted(planned_kills + placed, key=lambda k: k.at)), tuple(planned), dropped)


def _free_slots(busy: list[tuple[float, float]], start: float, end: float) -> list[float]:
    """Times ``SERVICE_KILL_SPACING_SECONDS`` apart in ``[start, end)`` outside every ``busy`` window ((from, to))."""
    slots, t = [], start
    for busy_from, busy_until in sorted(busy):
        while t + SERVICE_KILL_SPACING_SECONDS <= min(busy_from, end):
            slots.append(t)
            t += SERVICE_KILL_SPACING_SECONDS
        t = max(t, busy_until)
    while t < end:
        slots.append(t)
        t += SERVICE_KILL_SPACING_SECONDS
    return slots


def hold_range(kind: str, duration: float) -> tuple[float, float]:
    """Shortest and longest hold of a ``kind`` fault (``HOLD_SECONDS``) in a run of ``duration``
    seconds: the longest shrinks toward the shortest in runs shorter than ``FULL_RANGE_DURATION``."""
    low, high = HOLD_SECONDS[kind]
    return low, low + (high - low) * min(1.0, duration / FULL_RANGE_DURATION)


def _placed(
    rng: random.Random, lengths: list[float], start: float, end: float, blocked: Sequence[tuple[float, float]] = ()
) -> list[float]:
    """Start times for items of ``lengths`` in order, one after the other in ``[start, end]``
    with seeded gaps (back to back from ``start`` when they do not fit), each moved past any
    ``blocked`` window it would overlap."""
    slack = max(0.0, end - start - sum(lengths))
    cuts = sorted(rng.uniform(0, slack) for _ in lengths)
    gaps = [b - a for a, b in itertools.pairwise([0.0, *cuts])]
    starts, at = [], start
    for length, gap in zip(lengths, gaps, strict=True):
        at += gap
        moved = True
        while moved:
            moved = False
            for busy_from, busy_until in blocked:
                if at < busy_until and at + length > busy_from:
                    at, moved = busy_until, True
        starts.append(at)
        at += length
    return starts


def build_cluster_schedule(seed: int, duration: float, kills: int, *, outage_agent_kills: int = 2) -> Schedule:
    """The seeded plan of a ``turnlog chaos --cluster`` run of ``duration`` seconds.

    - Broker faults (``BROKER_FAULTS``), each once per full 400 s (at least once): the leader
      kill, then two brokers down (``BROKER_FAULTS_FIRST``), then the others in a seeded
      order, one after the other in
      ``BROKER_FAULT_WINDOW`` with seeded gaps, each planned ``PlannedFault.planned_seconds``
      long (its hold from :func:`hold_range`, then ``EXPECTED_RECOVERY_SECONDS`` and
      ``AFTER_OUTAGE_SECONDS``); planned windows never overlap, so at most two nodes are
      ever away (``NODES_TAKEN``). ``outage_agent_kills`` agents are SIGKILLed while two
      brokers are down.
    - Pipeline faults, as many rounds: a worker pause (of a sequencer or a sink worker,
      seeded) and a Postgres outage (as in :func:`build_schedule`), in a seeded order in
      ``OUTAGE_WINDOW``, never overlapping each other nor a planned two-brokers-down
      window (they may overlap the other broker faults).
    - ``kills`` SIGKILLs in seeded rounds over ``CLUSTER_COMPONENTS``: agents spread over
      ``OUTAGE_WINDOW``; services in slots outside the pipeline faults and the
      two-brokers-down windows (those with no slot left are dropped).
    """
    rng = random.Random(seed)
    rounds = max(1, int(duration // 400))

    broker_kinds: list[str] = []
    for _ in range(rounds):
        others = [kind for kind in BROKER_FAULTS if kind not in BROKER_FAULTS_FIRST]
        rng.shuffle(others)
        broker_kinds += [*BROKER_FAULTS_FIRST, *others]
    holds = [round(rng.uniform(*hold_range(kind, duration)), 1) for kind in broker_kinds]
    lengths = [
        hold + EXPECTED_RECOVERY_SECONDS[kind] + AFTER_OUTAGE_SECONDS
        for kind, hold in zip(broker_kinds, holds, strict=True)
    ]
    starts = _placed(rng, lengths, BROKER_FAULT_WINDOW[0] * duration, BROKER_FAULT_WINDOW[1] * duration)
    faults: list[PlannedFault] = []
    for kind, hold, length, at in zip(broker_kinds, holds, lengths, starts, strict=True):
        agent_kills: tuple[float, ...] = ()
        if kind == "two_brokers_down":
            agent_kills = tuple(
                sorted(round(rng.uniform(*OUTAGE_AGENT_KILL_WINDOW) * hold, 1) for _ in range(outage_agent_kills))
            )
        faults.append(PlannedFault(math.ceil(at * 10) / 10, kind, hold, round(length, 1), agent_kills=agent_kills))
    blocked = [(f.at, f.planned_end) for f in faults if NODES_TAKEN[f.kind] > 1]

    pipeline: list[tuple[str, float, str]] = []
    for _ in range(rounds):
        pipeline.append((WORKER_PAUSE, round(rng.uniform(*hold_range(WORKER_PAUSE, duration)), 1),
                         rng.choice(("sequencer", "sink"))))
        pipeline.append(("postgres", round(rng.uniform(*postgres_outage_range(duration)), 1),
                         rng.choice(("stop", "sigkill"))))
    rng.shuffle(pipeline)
    lengths = [
        hold + (EXPECTED_RECOVERY_SECONDS[WORKER_PAUSE] if kind == WORKER_PAUSE else 0.0) + AFTER_OUTAGE_SECONDS
        for kind, hold, _ in pipeline
    ]
    outages: list[PlannedOutage] = []
    busy = list(blocked)
    starts = _placed(rng, lengths, OUTAGE_WINDOW[0] * duration, OUTAGE_WINDOW[1] * duration, blocked)
    for (kind, hold, detail), length, at in zip(pipeline, lengths, starts, strict=True):
        at = math.ceil(at * 10) / 10
        if kind == WORKER_PAUSE:
            faults.append(PlannedFault(at, WORKER_PAUSE, hold, round(length, 1), target=detail))
        else:
            outages.append(PlannedOutage(at, "postgres", hold, detail))
        busy.append((at, at + length))

    order = [
        c for _ in range(kills // len(CLUSTER_COMPONENTS) + 1)
        for c in rng.sample(CLUSTER_COMPONENTS, len(CLUSTER_COMPONENTS))
    ][:kills]
    planned_kills = _agent_kills(rng, order.count("agent"), *(f * duration for f in OUTAGE_WINDOW))
    placed, dropped = _service_kills(order, _free_slots(busy, *(f * duration for f in SERVICE_KILL_WINDOW)))
    return Schedule(
        tuple(sorted(planned_kills + placed, key=lambda k: k.at)), tuple(outages), dropped,
        tuple(sorted(faults, key=lambda f: f.at)),
    )


def _agent_kills(rng: random.Random, count: int, start: float, end: float) -> list[PlannedKill]:
    """``count`` agent kills, one in each of ``count`` equal parts of ``[start, end]``."""
    span = end - start
    return [PlannedKill(round(start + (n + rng.uniform(0.2, 0.8)) * span / count, 1), "agent") for n in range(count)]


def _service_kills(order: list[str], slots: list[float]) -> tuple[list[PlannedKill], tuple[str, ...]]:
    """The service kills of ``order`` (in order) spread over ``slots``; those with no slot are dropped."""
    services = [c for c in order if c != "agent"]
    placed, dropped = services[: len(slots)], services[len(slots) :]
    kills = [
        PlannedKill(math.ceil(slots[n * len(slots) // len(placed)] * 10) / 10, component)  # never before the slot
        for n, component in enumerate(placed)
    ]
    return kills, tuple(dropped)
