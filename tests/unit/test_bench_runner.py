"""The bench's driver without a broker or a database (tools/bench/runner.py): the table it prints
from a report (tools/bench/table.py), and its phase tables: each phase after the phases it reads
from, the options that switch a phase off, a failure recorded or raised, a rate read before the
phase that measures it (tools/bench/context.py)."""

import contextlib
import io
import json
import typing
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import SecretStr

from turnlog.settings import TurnlogSettings
from turnlog.tools.bench.context import BenchRun, Report, Workload
from turnlog.tools.bench.options import BenchOptions, quick_options
from turnlog.tools.bench.runner import ALONE, PHASES, Phase, _run_phases
from turnlog.tools.bench.table import print_table

DATA = Path(__file__).resolve().parent / "data"
OPTIONS = BenchOptions(sessions_dir=Path("sessions"), admin_url=SecretStr("postgresql://x"))


def test_the_table_of_a_full_runs_report_is_printed_row_for_row():
    # bench-report.json is docs/bench/latest.json without the timeline and the per-sample lists, which the
    # table does not read; bench-table.txt is the table printed for it.
    report = json.loads((DATA / "bench-report.json").read_text())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_table(report)
    assert printed.getvalue() == (DATA / "bench-table.txt").read_text()


def test_each_phase_runs_after_the_phases_it_reads_from():
    order = [phase.name for phase in PHASES]
    assert len(set(order)) == len(order)
    needs = [
        # The variants run on pipelines of their own before the run's own pipeline starts.
        ("transactions", "capacity"), ("encryption", "capacity"),
        # The capacity phase starts the pipeline and the sampler, measures C and the CPU per event at capacity.
        *[("capacity", name) for name in ("signing", "redaction", "encryption_cost", "sustained", "memory")],
        # M sets the load of these.
        *[("sustained", name) for name in ("latency", "resume", "direct")],
    ]
    assert [(a, b) for a, b in needs if order.index(a) > order.index(b)] == []
    assert order[-2:] == ["timeline", "ratios"]  # the sampler stops once every phase has run; then the ratios


def test_only_the_repetitions_and_direct_switch_a_phase_of_a_full_run_off():
    def off(options: BenchOptions) -> set[str]:
        return {phase.name for phase in PHASES if phase.off is not None and phase.off(options)}

    assert off(OPTIONS) == set() and off(quick_options(OPTIONS)) == set()
    assert off(replace(OPTIONS, transactions_repetitions=0)) == {"transactions"}
    assert off(replace(OPTIONS, encryption_repetitions=0)) == {"encryption"}
    assert off(replace(OPTIONS, direct=False)) == {"direct"}
    assert {phase.name for phase in PHASES if phase.recovers} == {"transactions", "encryption", "resume", "direct"}


def test_a_phase_run_alone_is_one_of_only_and_runs_whatever_its_repetitions():
    only = typing.get_args(typing.get_args(typing.get_type_hints(BenchOptions)["only"])[0])
    assert set(ALONE) == set(only)
    assert {name: [phase.name for phase in phases] for name, phases in ALONE.items()} == {
        "transactions": ["transactions"],
        "encryption": ["encryption_cost", "encryption"],
        "tracing": ["tracing_cost", "tracing"],
    }
    assert [phase.name for phases in ALONE.values() for phase in phases if phase.off or phase.recovers] == []


def _work(options: BenchOptions = OPTIONS) -> Workload:
    return Workload(TurnlogSettings(), options, "r1", Path("logs"), [], [])


def test_the_phases_run_in_order_and_a_recovering_one_records_its_failure(capsys):
    seen: list[str] = []

    def adds(name: str):
        def run(work: Workload, report: Report) -> None:
            seen.append(name)
            report[name] = {"figure": 1}
        return run

    def fails(work: Workload, report: Report) -> None:
        raise RuntimeError("the broker is away")

    phases = [
        Phase("a", adds("a")),
        Phase("b", fails, recovers=True, after_failure=lambda work: seen.append("b caught up")),
        Phase("c", adds("c"), off=lambda options: not options.direct),
        Phase("d", adds("d")),
    ]
    report: Report = {}
    _run_phases(phases, _work(replace(OPTIONS, direct=False)), report)
    assert seen == ["a", "b caught up", "d"]
    assert report == {"a": {"figure": 1}, "b": {"error": "RuntimeError: the broker is away"}, "d": {"figure": 1}}
    assert "b phase failed: RuntimeError: the broker is away" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="the broker is away"):
        _run_phases([Phase("b", fails), Phase("a", adds("after"))], _work(), {})
    assert "after" not in seen


def test_a_rate_read_before_its_phase_ran_names_the_phase_that_measures_it():
    run = BenchRun(TurnlogSettings(), OPTIONS, "r1", Path("logs"), [], [], database="turnlog_bench_r1",
                   dsn="postgresql://x/turnlog_bench_r1", admin_dsn="postgresql://x/postgres", processes={})
    with pytest.raises(RuntimeError, match="the capacity phase starts it"):
        run.running_sampler()
    with pytest.raises(RuntimeError, match="the capacity phase measures it"):
        run.capacity_rate()
    with pytest.raises(RuntimeError, match="the sustained phase measures it"):
        run.sustained_rate()
    run.capacity, run.sustained = 2959.0, 1710.0
    assert (run.capacity_rate(), run.sustained_rate()) == (2959.0, 1710.0)
