"""What a chaos run watches while the schedule runs, each in a thread of its own until the run is
finished: the shared broker (or cluster nodes) and Postgres, for stops and restarts it did not make;
its service workers, restarting one that exits by itself; and the store, for when each turn an
agent's ``complete_turn`` returned for is first held complete (the catch-up figures)."""

from __future__ import annotations

import time
from collections.abc import Callable

from turnlog.sinks import StoreUnavailableError
from turnlog.tools.demo.chaos.probes import _complete_turns
from turnlog.tools.demo.chaos.shared_services import _running_pid
from turnlog.tools.demo.chaos.state import _Run

__all__ = ["watch_shared_services", "supervise_services", "watch_store", "track_store", "wait_caught_up",
           "STORE_POLL_SECONDS"]

#: How often the run looks for the agents' completed turns in the store (seconds).
STORE_POLL_SECONDS = 0.5


# -- the shared services and the run's workers --
def watched_services(run: _Run) -> dict[str, tuple[Callable[[], int | None], str]]:
    """The shared services this run acts on: name -> (its pid now or None, the key this run
    marks in ``ours`` while it acts on it). Postgres, and the single broker or each cluster node."""
    state = run.options.state_dir
    watched: dict[str, tuple[Callable[[], int | None], str]] = {
        "postgres": (lambda: _running_pid(state / "postgres" / "postmaster.pid"), "postgres"),
    }
    cluster = run.cluster
    if cluster is None:
        watched["broker"] = (lambda: _running_pid(state / "kafka" / "kafka.pid"), "broker")
    else:
        for node in cluster.node_ids:
            watched[f"node {node}"] = (lambda node=node: cluster.pid(node), "cluster")  # type: ignore[misc]
    return watched


def watch_shared_services(run: _Run) -> None:
    """Record every stop or restart of the shared broker (or cluster nodes) and Postgres this
    run did not make (other people's tests use them too): such a run's figures are not its own."""
    watched = watched_services(run)
    known = {service: pid() for service, (pid, _) in watched.items()}
    while not run.finished.wait(0.5):
        for service, (running_pid, key) in watched.items():
            with run.lock:
                ours, down = key in run.ours, key in run.down_by_us
            pid = running_pid()
            if ours:
                known[service] = None  # read again once this run's own stop or start is done
                continue
            if down:
                if pid is not None and known[service] != pid:
                    what = f"started (pid {pid}) during this run's outage"
                    run.interference.append({"at_seconds": round(run.now(), 1), "service": service, "what": what})
                    print(f"  {run.now():6.1f}s {service} {what}, by someone else", flush=True)
                known[service] = pid
                continue
            if known[service] is None:
                known[service] = pid
            elif pid != known[service]:
                what = "stopped" if pid is None else f"restarted (pid {pid})"
                run.interference.append({"at_seconds": round(run.now(), 1), "service": service, "what": what})
                print(f"  {run.now():6.1f}s {service} {what} by someone else", flush=True)
                known[service] = pid


def supervise_services(run: _Run) -> None:
    """Restart a service that exited by itself (a supervisor would), and report it."""
    restarted: dict[str, float] = {}
    while not run.finished.wait(1.0):
        with run.services_lock:
            for worker, process in list(run.services.items()):
                at = run.now()
                if process.alive() or at - restarted.get(worker, -60.0) < 5.0:  # back off a crash loop
                    continue
                restarted[worker] = at
                exit_code = process.popen.returncode
                run.services[worker] = run.start_service(run.components[worker], f"{worker}-restarted-{int(at)}",
                                                         worker)
                run.service_exits.append(
                    {"at_seconds": round(at, 1), "component": worker, "exit": exit_code,
                     "log": str(process.log_path)}
                )
                print(f"  {at:6.1f}s {worker} exited by itself (exit {exit_code}, {process.log_path}); "
                      "restarted", flush=True)


# -- latency and catch-up --
def watch_store(run: _Run) -> None:
    """Read the agents' latency logs and note when each call's turn is first seen stored
    complete (``STORE_POLL_SECONDS`` apart; a store that does not answer is asked again)."""
    while not run.finished.wait(STORE_POLL_SECONDS):
        track_store(run)


def track_store(run: _Run) -> None:
    read_at = time.monotonic()
    completed = run.latency.read()
    with run.lock:
        run.completed = completed
    pending = run.stored_turns.pending(completed)
    if pending:
        queried_at = time.monotonic()
        try:
            found = _complete_turns(run.store, sorted({t.session_id for t in pending}))
        except StoreUnavailableError:
            return
        run.stored_turns.observe(found, queried_at)
    with run.lock:
        run.tracked_at = read_at


def caught_up_at(run: _Run, before: float) -> float | None:
    """When the store held every turn whose ``complete_turn`` had returned by ``before``
    (monotonic), as far as the latest look tells; None if not yet (or not looked since)."""
    with run.lock:
        if run.tracked_at < before:
            return None
        completed = run.completed
    return run.stored_turns.caught_up_at(completed, before)


def wait_caught_up(run: _Run, before: float, timeout: float) -> float | None:
    """Seconds from ``before`` until the pipeline caught up with it (:func:`caught_up_at`); None after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        at = caught_up_at(run, before)
        if at is not None:
            return max(0.0, at - before)
        time.sleep(STORE_POLL_SECONDS / 2)
    return None
