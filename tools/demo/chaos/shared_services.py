"""The shared local broker and Postgres as the chaos run acts on them: found by the pid files
their deploy scripts (``deploy/kafka.sh``, ``deploy/postgres.sh``) keep under the state dir,
SIGKILLed or stopped, started again, and left running whatever happened."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from turnlog.deploy.local import SCRIPTS
from turnlog.exceptions import ConfigurationError
from turnlog.settings import TurnlogSettings
from turnlog.sinks import SqlStore
from turnlog.tools.demo.chaos.probes import _broker_answers, _held_within

#: How long a deploy script may take (seconds). A broker SIGKILLed with many partitions recovers
#: every log at its next start (no clean-shutdown file): on two busy cores, 400 partitions took
#: over a minute, longer than ``kafka.sh``'s own 90 s default, which the run therefore raises.
SCRIPT_TIMEOUT_SECONDS = 240
_SCRIPT_ENVIRONMENT = {"TURNLOG_KAFKA_START_TIMEOUT": str(SCRIPT_TIMEOUT_SECONDS - 20)}


def _script(name: str, command: str) -> None:
    """Run ``deploy/<name> <command>``.

    Raises:
        RuntimeError: it failed or took longer than :data:`SCRIPT_TIMEOUT_SECONDS`; the message
            ends with the script's last line of output (the deploy scripts print no secret).
    """
    try:
        subprocess.run(["bash", str(SCRIPTS / name), command], check=True, capture_output=True, text=True,
                       timeout=SCRIPT_TIMEOUT_SECONDS, env={**os.environ, **_SCRIPT_ENVIRONMENT})
    except subprocess.CalledProcessError as e:
        said = (e.stderr or e.stdout or "").strip().splitlines()
        raise RuntimeError(f"deploy/{name} {command} exited {e.returncode}: {said[-1] if said else 'no output'}") from e
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"deploy/{name} {command} took over {SCRIPT_TIMEOUT_SECONDS}s") from e


def _running_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` if that process runs, else None."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def _require_killable_services(state_dir: Path, *, broker: bool) -> None:
    """Fail before the run when the services the schedule SIGKILLs and stops are not the local
    deploy scripts' of ``state_dir`` (their pid files are how chaos finds them).

    Raises:
        ConfigurationError: no running broker (``broker``) or Postgres has its pid file there.
    """
    pid_files = {"Postgres": state_dir / "postgres" / "postmaster.pid"}
    if broker:
        pid_files["the broker"] = state_dir / "kafka" / "kafka.pid"
    for name, pid_file in pid_files.items():
        if _running_pid(pid_file) is None:
            raise ConfigurationError(
                f"turnlog chaos kills {name} started by deploy/services.sh with TURNLOG_STATE_DIR={state_dir},"
                f" and none runs there ({pid_file}): set TURNLOG_STATE_DIR to the state dir its services"
                " were started with"
            )


def _kill_broker(state_dir: Path) -> str:
    """SIGKILL the local broker; what was killed (someone else may have stopped it already)."""
    pid = int((state_dir / "kafka" / "kafka.pid").read_text().split()[0])
    try:
        _kill_pid(pid)
    except ProcessLookupError:
        return f"pid {pid} (was down already)"
    return f"pid {pid}"


def _kill_pid(pid: int) -> int:
    """SIGKILL ``pid`` and wait until it is gone."""
    os.kill(pid, signal.SIGKILL)
    _held_within(lambda: not Path(f"/proc/{pid}").exists(), 30, f"pid {pid} to exit")
    return pid


def _stop_postgres(state_dir: Path, method: str) -> str:
    """Stop the local Postgres: ``stop`` (deploy/postgres.sh, a fast shutdown) or
    ``sigkill`` (the postmaster; its children exit when they see it gone, and
    the next start recovers from the WAL). Returns what was stopped."""
    if method == "stop":
        _script("postgres.sh", "stop")
        return "deploy/postgres.sh stop"
    pid = int((state_dir / "postgres" / "postmaster.pid").read_text().split()[0])
    children = _child_pids(pid)
    _kill_pid(pid)
    # The next postmaster refuses to start while an old backend still holds the shared memory.
    _held_within(lambda: not any(Path(f"/proc/{child}").exists() for child in children), 60,
                 "the postmaster's children to exit")
    return f"postmaster pid {pid}"


def _child_pids(parent: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


def _ensure_services_up(state_dir: Path, settings: TurnlogSettings, store: SqlStore, *, broker: bool = True) -> None:
    """Whatever happened, leave the shared broker (with ``broker``) and Postgres running (other people use them)."""
    if broker and not _broker_answers(settings):
        subprocess.run(["bash", str(SCRIPTS / "kafka.sh"), "start"], check=False, capture_output=True, timeout=180)
    if not store.answers():
        subprocess.run(["bash", str(SCRIPTS / "postgres.sh"), "start"], check=False, capture_output=True, timeout=180)
