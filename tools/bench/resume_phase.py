"""Phase 5, **resume** at 50 % of M: ``resume()`` timed, through the store and through ``turnlog api``,
while the generator offers half the sustained rate (``resume_probe.py`` runs the resumes)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from turnlog.deploy.processes import ServiceProcess, start_pipeline
from turnlog.settings import TurnlogSettings
from turnlog.tools.bench import baselines as base
from turnlog.tools.bench.context import BenchRun, Report
from turnlog.tools.bench.load import plans_for_rate, run_load
from turnlog.tools.bench.options import BenchOptions
from turnlog.tools.bench.pipeline_phases import cpu_used, wait_drained
from turnlog.tools.bench.probes import Sampler, lag_stats
from turnlog.tools.bench.resume_probe import resume_summary, run_probe_process
from turnlog.tools.bench.workload import BENCH_FLEET

__all__ = ["measure_resume"]


def measure_resume(run: BenchRun, report: Report) -> None:
    """Resume latency at 50 % of M (``run.sustained_rate()``) on the run's pipeline: ``resume``."""
    report["resume"] = _resume(run.settings, run.plans, run.sustained_rate(), run.running_sampler(), run.options,
                               run.processes, run.log_dir, run.run_id)


def _resume(
    settings: TurnlogSettings, plans, sustained: float, sampler: Sampler, options: BenchOptions,
    processes: dict[str, ServiceProcess], log_dir: Path, run: str,
) -> dict[str, Any]:
    """Resume latency while the generator offers half the sustained rate (``resume_probe.py``),
    with the pipeline's lag and the cores each process used meanwhile."""
    import os

    probe_settings, api_url = settings, None
    out: dict[str, Any] = {}
    api: ServiceProcess | None = None
    if options.resume_api:
        token, port = f"bench-{run}-resume", _free_port()
        try:
            api = start_pipeline(
                settings.model_copy(update={"api_tokens": {token: [BENCH_FLEET]}, "api_port": port}),
                log_dir, services=("api",), extra_env={"TURNLOG_LOG_LEVEL": "WARNING"},
            )["api"]
            api.wait_ready(60)  # its ready file: the transcript hub follows the topic
            _wait_http(f"http://127.0.0.1:{port}/healthz", 60, api)  # and the port answers
            probe_settings, api_url = settings.model_copy(update={"api_token": SecretStr(token)}), f"http://127.0.0.1:{port}"
        except Exception as e:  # the store path is still measured
            out["api_error"] = f"{type(e).__name__}: {e}"
            print(f"resume: turnlog api did not start ({out['api_error']}); measuring the store path only")
    try:
        probe_log = log_dir / "resume-probe.log"
        # The same run's baseline: resumes with no load (the pipeline idle).
        now = time.monotonic()
        idle = asyncio.run(run_probe_process(probe_settings, api_url=api_url, begin_at=now, end_at=now + 120,
                                             samples=options.resume_idle_samples, tag="resume-idle",
                                             log_path=probe_log))
        chosen = plans_for_rate(plans, 0.5 * sustained, speed=options.speed, flush_interval=options.flush_interval)

        window: dict[str, float] = {}

        async def phase() -> tuple[Any, Any]:
            began, stop = time.monotonic(), asyncio.Event()
            window["began"] = began

            async def probe() -> Any:
                try:
                    return await run_probe_process(probe_settings, api_url=api_url, begin_at=began + 3,
                                                   end_at=began + options.resume_seconds - 5,
                                                   samples=options.resume_samples,
                                                   tag="resume", log_path=probe_log)
                finally:
                    stop.set()  # the load ends with the probe

            outcomes = await asyncio.gather(
                run_load(settings, chosen, speed=options.speed, seconds=options.resume_seconds, tag="r50", stop=stop),
                probe(),
                return_exceptions=True,  # a failed probe stops the load, which then ends its sessions
            )
            load, probes = outcomes  # unpacked apart: mypy cannot type it unpacked from the await
            window["ended"] = time.monotonic()
            for outcome in (load, probes):
                if isinstance(outcome, BaseException):
                    raise outcome
            return load, probes

        watched = {**processes, **({"api": api} if api is not None else {})}
        cpu_before, children_before = cpu_used(watched), os.times()
        load, probes = asyncio.run(phase())
        children = os.times()
        wall = window["ended"] - window["began"]
        cores = {name: (used - cpu_before[name]) / wall for name, used in cpu_used(watched).items()}
        # The probe is the one child process waited for in the phase (the API is stopped after it).
        cores["resume probe"] = (children.children_user + children.children_system
                                 - children_before.children_user - children_before.children_system) / wall
    finally:
        if api is not None:
            api.stop()
    wait_drained(sampler, 300)
    out["offered_events_per_second"] = load.events_per_second
    out["share_of_sustained"] = load.events_per_second / max(sustained, 1e-9)
    out["seconds"] = load.seconds
    out["turns"] = load.turns
    out["cores_used"] = cores
    # The pipeline's lag while resumes ran (after the load's first 3 s): what a barrier waits behind.
    out["lag"] = lag_stats([s for s in sampler.samples if window["began"] + 3 <= s.at <= window["ended"]],
                           rate=load.events_per_second)
    out["complete_turn_p50_ms"] = base.percentile(load.complete_ms, 50)
    out["complete_turn_p99_ms"] = base.percentile(load.complete_ms, 99)
    print(f"resume phase load: {load.events_per_second:,.0f} ev/s offered over {load.seconds:.0f} s "
          f"({out['share_of_sustained']:.2f} of sustained); complete_turn p50 {out['complete_turn_p50_ms']:.1f} ms, "
          f"p99 {out['complete_turn_p99_ms']:.1f} ms; lag mean {out['lag']['records']['mean']:,.0f} records "
          f"(sequencer {out['lag']['sequencer_records']['mean']:,.0f}, sink"
          f" {out['lag']['sink_records']['mean']:,.0f}), "
          f"p99 {out['lag']['records']['p99']:,.0f}; cores: " + ", ".join(f"{k} {v:.2f}" for k, v in cores.items()))
    out["idle"] = {}
    for name, samples in idle.items():
        out["idle"][name] = {**resume_summary(samples.samples_ms, stale=samples.stale),
                             "failures": samples.failures[:10]}
    for name, samples in probes.items():
        out[name] = {**resume_summary(samples.samples_ms, stale=samples.stale), "failures": samples.failures[:10]}
        r, i = out[name], out["idle"][name]
        print(f"resume via {name} at 50%: p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms over"
              f" {r['samples']} resumes"
              f" ({r['failed']} failed, {r['stale']} stale) at {load.events_per_second:,.0f} ev/s offered;"
              f" idle: p50 {i['p50_ms']:.0f} ms, p99 {i['p99_ms']:.0f} ms over {i['samples']}")
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float, process: ServiceProcess) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if not process.alive():
            raise RuntimeError(f"it exited; see {process.log_path}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {timeout:.0f} s; see {process.log_path}")
        time.sleep(0.2)
