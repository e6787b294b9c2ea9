"""Resume latency under load: a session is recorded, its process "dies", and a
new recorder resumes it while the load generator keeps the pipeline busy.

Each sample, one after another:

1. the *origin* recorder (one for the whole phase, like a live agent process)
   starts a session and completes ``turns`` turns, each awaiting its ack;
2. the origin stops recording it without ending it (its process died);
3. a *successor*, a new ``SessionRecorder`` with a spool of its own (a new
   process's view: a new producer, and on the store path a store of its own
   whose first connection is made inside the resume), is started;
4. ``successor.resume(key)`` is timed end to end: draining this host's
   spool of the session, the resume barrier (the sequencer and the sink
   caught up on the session's partition), the epoch claim and the read of the
   stored turns. The grant must hold the ``turns`` completed turns, or the
   sample counts as stale;
5. the successor ends the session and closes (not timed).

Steps 1 to 4 happen right after one another, so the barrier waits for the
pipeline to apply the turns just acknowledged: the worst moment to resume, as
right after a crash. Paths alternate sample by sample (``store``: the recorder
opens the store itself; ``api``: ``POST /api/sessions/{key}/resume`` of a
running ``turnlog api``), so each sees the same load. A resume that fails
(timeout, error) is a sample of infinite latency: it shows in the percentiles.

The probe runs in a process of its own (:func:`run_probe_process`, which
runs ``python -m turnlog.tools.bench.resume_probe``), as another agent would, so
its recorders' threads do not share the load generator's interpreter.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from turnlog.producers import SessionRecorder
from turnlog.resume_barrier import resume_source_for
from turnlog.schemas import TurnStatus
from turnlog.settings import TurnlogSettings
from turnlog.tools.bench.baselines import percentile
from turnlog.tools.bench.workload import BENCH_FLEET

__all__ = ["ResumeSamples", "resume_probe", "run_probe_process", "resume_summary", "RESUME_GOAL_P99_MS"]

#: The issue's goal: p99 of resume() at 50 % load at most 1 s.
RESUME_GOAL_P99_MS = 1000.0

_TURNS = (
    ("user", "Hi, I'd like to move my appointment to Thursday."),
    ("agent", "Sure. Which time on Thursday works for you?"),
    ("user", "Anything after three in the afternoon, please."),
    ("agent", "I have three thirty or four fifteen. Which one would you like?"),
)


@dataclass
class ResumeSamples:
    """One path's samples: milliseconds of each ``resume()`` (``inf``: it failed)."""

    samples_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: Grants whose stored turns were not the turns the origin completed.
    stale: int = 0


def resume_summary(
    samples_ms: Sequence[float], *, stale: int = 0, goal_p99_ms: float = RESUME_GOAL_P99_MS
) -> dict[str, Any]:
    """p50/p95/p99/max (nearest rank) of one path's samples, and whether p99 meets the goal.

    Failed resumes are ``inf`` samples, so they count against the percentiles;
    the mean is over the resumes that succeeded. With fewer than 100 samples
    the nearest-rank p99 is the maximum.
    """
    finite = [s for s in samples_ms if math.isfinite(s)]
    p99 = percentile(samples_ms, 99)
    return {
        "samples": len(samples_ms),
        "failed": len(samples_ms) - len(finite),
        "stale": stale,
        "p50_ms": percentile(samples_ms, 50),
        "p95_ms": percentile(samples_ms, 95),
        "p99_ms": p99,
        "max_ms": max(samples_ms) if samples_ms else float("nan"),
        "mean_ms": sum(finite) / len(finite) if finite else float("nan"),
        "goal_p99_ms": goal_p99_ms,
        "goal_met": bool(samples_ms) and p99 <= goal_p99_ms and stale == 0,
        "samples_ms": list(samples_ms),
    }


async def resume_probe(
    origin_settings: TurnlogSettings,
    paths: Mapping[str, TurnlogSettings],
    *,
    begin_at: float,
    end_at: float,
    samples: int,
    tag: str,
    turns: int = 3,
    timeout: float = 30.0,
) -> dict[str, ResumeSamples]:
    """Take up to ``samples`` resumes per path between the monotonic times
    ``begin_at`` and ``end_at`` (no sample starts after it); session ids get ``tag``.

    ``paths`` maps a path's name to the successor's settings: ``api_url`` set
    means the API path, otherwise the recorder runs the barrier over ``database_url`` itself
    (:func:`~turnlog.resume_barrier.resume_source_for`).
    """
    results = {name: ResumeSamples() for name in paths}
    names = list(paths)
    await asyncio.sleep(max(0.0, begin_at - time.monotonic()))
    async with SessionRecorder(origin_settings, producer_id=f"bench-{tag}-origin") as origin:
        i = 0
        while time.monotonic() < end_at and any(len(r.samples_ms) < samples for r in results.values()):
            name = names[i % len(names)]
            i += 1
            if len(results[name].samples_ms) >= samples:
                continue
            session_id = f"{origin_settings.topic_prefix}-{tag}-{i:04d}"
            await _one(origin, paths[name], session_id, results[name], turns=turns, timeout=timeout, tag=tag)
    return results


async def _one(
    origin: SessionRecorder, settings: TurnlogSettings, session_id: str, into: ResumeSamples, *, turns: int,
    timeout: float, tag: str
) -> None:
    session = await origin.start_session(session_id, fleet=BENCH_FLEET, agent_id="bench-resume")
    for index in range(turns):
        speaker, text = _TURNS[index % len(_TURNS)]
        await session.complete_turn(index, speaker, text, input_tokens=len(text.split()), output_tokens=0)
    # The origin now stops recording the session without ending it: its process died.
    successor = SessionRecorder(
        settings, producer_id=f"bench-{tag}-successor", resume_source=resume_source_for(settings)
    )
    await successor.start()
    try:
        began = time.perf_counter()
        try:
            resumed = await successor.resume(session.session_id, timeout=timeout)  # by the key the origin wrote
        except Exception as e:  # a failed resume is a sample too: of infinite latency
            into.samples_ms.append(float("inf"))
            into.failures.append(f"{session.session_id}: {type(e).__name__}: {e}")
            return
        into.samples_ms.append((time.perf_counter() - began) * 1000)
        if [(t.turn_index, t.status) for t in resumed.turns] != [(k, TurnStatus.COMPLETE) for k in range(turns)]:
            into.stale += 1
        await resumed.end("completed")
    finally:
        await successor.close()


async def run_probe_process(
    settings: TurnlogSettings,
    *,
    api_url: str | None,
    begin_at: float,
    end_at: float,
    samples: int,
    tag: str,
    log_path: Path,
) -> dict[str, ResumeSamples]:
    """:func:`resume_probe` in a child process (``python -m turnlog.tools.bench.resume_probe``):
    the ``store`` path, and the ``api`` path too when ``api_url`` is given (its token
    is ``settings.api_token``). ``begin_at`` and ``end_at`` are ``time.monotonic()``
    values (the clock is the system's, the same in every process).

    Raises:
        RuntimeError: the child failed; its output is in ``log_path``.
    """
    env = {**os.environ, **settings.as_environment()}
    env.pop("TURNLOG_API_URL", None)
    argv = [sys.executable, "-m", "turnlog.tools.bench.resume_probe", json.dumps(
        {"api_url": api_url, "begin_at": begin_at, "end_at": end_at, "samples": samples, "tag": tag}
    )]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        child = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=log,
                                                     stdin=asyncio.subprocess.DEVNULL)
        out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the resume probe exited with {child.returncode}; see {log_path}")
    answer = json.loads(out.decode().strip().splitlines()[-1])
    return {name: ResumeSamples(**fields) for name, fields in answer.items()}


def main(argv: Sequence[str]) -> None:
    """``python -m turnlog.tools.bench.resume_probe '{"api_url": ..., "begin_at": ..., ...}'``:
    settings from the environment; one JSON line of :class:`ResumeSamples` per path on stdout."""
    import logging

    from turnlog.settings import load_settings

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = json.loads(argv[0])
    settings = load_settings().model_copy(update={"api_url": None})
    paths = {"store": settings}
    if args["api_url"]:
        paths["api"] = settings.model_copy(update={"api_url": args["api_url"]})
    results = asyncio.run(
        resume_probe(settings, paths, begin_at=args["begin_at"], end_at=args["end_at"], samples=args["samples"],
                     tag=args["tag"])
    )
    print(json.dumps({name: asdict(r) for name, r in results.items()}))


if __name__ == "__main__":
    main(sys.argv[1:])
