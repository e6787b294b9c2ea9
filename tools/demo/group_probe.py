"""Consumer-group descriptions for the chaos run, asked from a child process of their own.

The chaos run tells a replacement sequencer or finalizer has joined its group from the
broker's description of the group (``turnlog.kafka.group_members``: an admin
``DescribeConsumerGroups``). librdkafka's admin requests can abort the whole process
when a broker goes away while one is in flight (``rd_kafka_enq_once_del_source_return:
Assertion `eonce->refcnt > 0' failed``, confluentinc/librdkafka#4605, still open), and
taking brokers away is what the run does. So the run asks a child process
(:class:`GroupProbe`); when librdkafka aborts it, only that answer is lost (no
answer: the group is not stable) and the next question starts a new child.

The child asks each question through an admin client of its own: one kept across a
node's SIGSTOP kept timing out on every question (for minutes after the SIGCONT too)
while the group was stable on another coordinator.

The child (``python -m turnlog.tools.demo.group_probe``, settings from the
environment) reads one group id per line on stdin and answers one JSON line per
question: ``{"stable": bool, "members": [member id, ...]}``, or ``{"error": "..."}``
when the broker did not answer or refused.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import msgspec

__all__ = ["GroupProbe", "GroupAnswer", "main"]

#: Longest the child gets for one answer (its request's own timeout is 5 s), seconds.
ANSWER_TIMEOUT_SECONDS = 15.0


class GroupAnswer(msgspec.Struct, frozen=True, omit_defaults=True):
    stable: bool = False
    members: tuple[str, ...] = ()
    error: str | None = None


class GroupProbe:
    """Asks a child process for consumer groups' members; thread-safe.

    ``env``: the settings' environment (``TurnlogSettings.as_environment()``);
    ``log_path``: where the children's stderr goes. :attr:`restarts` counts the
    children that died or did not answer in time (each was replaced).
    """

    #: the child's argv
    command: tuple[str, ...] = (sys.executable, "-m", "turnlog.tools.demo.group_probe")

    def __init__(self, env: Mapping[str, str], log_path: Path) -> None:
        self._env = {**os.environ, **env}
        self._log_path = log_path
        self._child: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._lock = threading.Lock()
        self.restarts = 0
        self.last_answer: GroupAnswer | None = None

    def members(self, group: str) -> tuple[bool, frozenset[str]]:
        """Whether ``group`` is stable, and its members' ids; (False, {}) when the broker did not
        answer, refused, or the child died or did not answer within ``ANSWER_TIMEOUT_SECONDS``.
        :attr:`last_answer` keeps the newest answer (None: the child gave none)."""
        with self._lock:
            self.last_answer = None
            child = self._running_child()
            assert child.stdin is not None and child.stdout is not None
            try:
                child.stdin.write(group.encode() + b"\n")
                child.stdin.flush()
                line = _read_line(child.stdout, ANSWER_TIMEOUT_SECONDS)
            except OSError:  # the child is gone (a broken pipe)
                line = b""
            if not line:
                self._replace()
                return False, frozenset()
            answer = self.last_answer = msgspec.json.decode(line, type=GroupAnswer)
            return answer.stable and answer.error is None, frozenset(answer.members)

    def close(self) -> None:
        with self._lock:
            self._stop_child()
            if self._log is not None:
                self._log.close()
                self._log = None

    def _running_child(self) -> subprocess.Popen[bytes]:
        if self._child is None or self._child.poll() is not None:
            if self._child is not None:
                self.restarts += 1
            if self._log is None:
                self._log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log = self._log_path.open("ab")
            self._child = subprocess.Popen(
                list(self.command), env=self._env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            )
        return self._child

    def _replace(self) -> None:
        """The child died or hangs: stop it; the next question starts another."""
        self._stop_child()
        self.restarts += 1

    def _stop_child(self) -> None:
        if self._child is not None:
            if self._child.poll() is None:
                self._child.kill()
            self._child.wait()
            for pipe in (self._child.stdin, self._child.stdout):
                if pipe is not None:
                    pipe.close()
            self._child = None


def _read_line(stream: IO[bytes], timeout: float) -> bytes:
    """One line from ``stream`` (a pipe), or b"" at its end or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream], [], [], left)[0]:
            return b""
        chunk = os.read(stream.fileno(), 1)  # one byte at a time: nothing is read past the line
        if not chunk:
            return b""
        line += chunk
    return line


def main() -> None:
    """The child: answer each group id read from stdin (settings from the environment)."""
    from turnlog import kafka
    from turnlog.settings import load_settings

    settings = load_settings()
    for raw in sys.stdin.buffer:
        group = raw.decode().strip()
        try:
            found = kafka.group_members(kafka.admin(settings, log_level=0), group)
            answer = GroupAnswer(stable=found.stable, members=tuple(sorted(found.member_ids)))
        except kafka.BrokerError as e:
            answer = GroupAnswer(error=type(e).__name__)
        sys.stdout.buffer.write(msgspec.json.encode(answer) + b"\n")
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
