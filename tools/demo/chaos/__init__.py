"""``turnlog chaos``: the demo workload under SIGKILLs of every component and long outages.

For ``duration`` seconds the real transcripts are replayed (time-compressed so
the longest spans 85% of the run, with their real overlapping timing) while a
seeded schedule (:func:`build_schedule`) does, in one run:

- **SIGKILLs** of agents (each resumed in a new process), the sequencer, the
  sink, the finalizer and the Kafka broker, each restarted at once;
- **broker outages** longer than the delivery timeout: the broker SIGKILLed
  and kept down ``max(60, delivery timeout + 30)`` to 120 s (scaled to the
  run), then started again; at least one per run. The agents go on talking
  meanwhile: their recorders must keep every event in their local spool and
  deliver it once the broker is back;
- **agent SIGKILLs during a broker outage**: the resumed process must first
  deliver the dead one's spool and pass the resume barrier, which both wait
  for the broker, so each resume attempt may take the rest of the outage
  (``resume_timeout_seconds`` is set past the longest outage, and a failed
  attempt is retried);
- **Postgres outages**: stopped (``deploy/postgres.sh stop``) or its
  postmaster SIGKILLed, kept down 20 to 60 s (scaled to the run), then started.

With ``cluster`` (``turnlog chaos --cluster``) the run goes to the local 3-node
KRaft cluster (``turnlog.deploy.cluster.LocalCluster``, started if down) with
topics of 3 replicas and min ISR 2, two sequencer and two sink workers and one
finalizer, and its schedule (:func:`build_cluster_schedule`) replaces the
broker's kill and outage with the cluster's faults, one broker fault at a time,
each once every node is back, the ISR full and the pipeline caught up (the
first two under the heaviest load, the other two in a seeded order):

- the node leading the most ``events`` partitions SIGKILLed under load, started
  again after 15 to 45 s;
- a rolling restart: each node stopped and started in turn, each step once
  every partition of the run's topics has its full ISR again;
- one node SIGSTOPped for 30 to 90 s, then SIGCONTed;
- two nodes SIGKILLed for 30 to 60 s (below min ISR, and the controller quorum
  lost), agents SIGKILLed meanwhile, then started;
- and, beside them, a sequencer or sink worker SIGSTOPped for 20 to 40 s, past
  its group's 10 s session timeout, then SIGCONTed (holds are scaled down in
  runs shorter than 600 s). Nothing is left stopped at the end, and every node
  runs again. The producers keep the settings' delivery timeout (120 s), which
  outlasts a failover.

Afterwards every session is judged as in the demo (``turnlog.tools.demo.verdict``)
and the report gives events sent and stored, turns lost, duplicated, altered
and out of order, wrong aggregates (sums of the verdict's typed problems by
kind), each kill and outage with its recovery time, and agents that failed.
Each agent writes every ``complete_turn`` that returned to a latency log
(``<run>/latency/``, :mod:`turnlog.tools.demo.latency`); the run watches the
store for those turns, and the report has, per kind of kill, outage or fault,
the calls' latency p50/p99/max from its start until it recovered, and its
catch-up: from its end until the store held every turn completed by then. A
turn whose ``complete_turn`` returned and that the store never held is a
violation (``acknowledged_not_stored``).

Recovery time, from the SIGKILL (for an outage: from the restart) until the
component works again: a resumed agent's ``resumed`` line; a replacement
sequencer or finalizer seen by the broker as a new member of its consumer
group, with the group stable; a replacement sink storing (or caught up with
the transcript); a broker answering; after an outage, the sink storing again
(or caught up).

Chaos settings: the run's own topics, groups, Faust data and spool folder;
on the single broker ``delivery_timeout_seconds`` is 20 s (120 s by default) so that each outage is
at least three delivery timeouts long: every event spooled during it outlives
its producer's delivery attempts and has to be driven again from the spool,
which is what a recorder that "never gives a session up" must survive.

The package, by job (the seeded schedules are ``turnlog.tools.demo.schedule``):

- ``run.py``: :func:`run_chaos`, the run from start to verdict;
- ``options.py``: :class:`ChaosOptions`;
- ``state.py``: the run's state (``_Run``): its processes, records and background steps;
- ``faults.py``: the kills, outages and worker pauses, each with its recovery;
- ``cluster.py``: what is particular to ``--cluster`` (its workers, settings and broker faults);
- ``watch.py``: the watchers (shared services, service workers, the store's catch-up);
- ``probes.py``: the small probes (broker, database, groups, offsets, stored turns);
- ``shared_services.py``: the shared broker and Postgres, found by their pid files;
- ``report.py``: the verdict, the figures and the JSON report.
"""

from __future__ import annotations

from turnlog.tools.demo.chaos.options import ChaosOptions
from turnlog.tools.demo.chaos.report import ProblemTally, SessionProblem, tally_problems
from turnlog.tools.demo.chaos.run import run_chaos
from turnlog.tools.demo.chaos.shared_services import (
    _require_killable_services as _require_killable_services,  # re-exported: the check before a run (tests)
)
from turnlog.tools.demo.schedule import (
    CLUSTER_COMPONENTS,
    CLUSTER_FAULTS,
    COMPONENTS,
    PlannedFault,
    PlannedKill,
    PlannedOutage,
    Schedule,
    build_cluster_schedule,
    build_schedule,
)

__all__ = [
    "ChaosOptions",
    "run_chaos",
    "build_schedule",
    "build_cluster_schedule",
    "Schedule",
    "PlannedKill",
    "PlannedOutage",
    "PlannedFault",
    "COMPONENTS",
    "CLUSTER_COMPONENTS",
    "CLUSTER_FAULTS",
    "SessionProblem",
    "ProblemTally",
    "tally_problems",
]
