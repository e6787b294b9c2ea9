"""`turnlog chaos` SIGKILLs the broker and stops Postgres by the pid files of their deploy
scripts' state dir: a run whose services are not there is refused before anything starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from turnlog.exceptions import ConfigurationError
from turnlog.tools.demo.chaos import _require_killable_services


def _pid_file(path: Path, pid: int) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(f"{pid}\n")


def test_a_state_dir_without_the_running_broker_is_refused(tmp_path: Path):
    _pid_file(tmp_path / "postgres" / "postmaster.pid", os.getpid())
    with pytest.raises(ConfigurationError, match="the broker") as refused:
        _require_killable_services(tmp_path, broker=True)
    assert str(tmp_path / "kafka" / "kafka.pid") in str(refused.value)


def test_a_pid_file_of_a_process_that_is_gone_is_refused(tmp_path: Path):
    _pid_file(tmp_path / "postgres" / "postmaster.pid", 2**22 + 1)  # above Linux's pid_max
    with pytest.raises(ConfigurationError, match="Postgres"):
        _require_killable_services(tmp_path, broker=False)


def test_running_services_pass_and_a_cluster_run_needs_no_single_broker(tmp_path: Path):
    _pid_file(tmp_path / "postgres" / "postmaster.pid", os.getpid())
    _require_killable_services(tmp_path, broker=False)
    _pid_file(tmp_path / "kafka" / "kafka.pid", os.getpid())
    _require_killable_services(tmp_path, broker=True)
