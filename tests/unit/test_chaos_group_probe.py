"""The chaos run's group probe: answers come from a child process, and a child that dies (as
librdkafka's abort kills it) costs one answer, not the run."""

from __future__ import annotations

import sys
import textwrap

from turnlog.tools.demo.group_probe import GroupProbe

#: Answers "g1" with two members, aborts on "boom", says the broker did not answer for anything else.
FAKE_CHILD = textwrap.dedent("""
    import os, sys
    for line in sys.stdin:
        group = line.strip()
        if group == "boom":
            os.abort()
        answer = '{"stable": true, "members": ["m1", "m2"]}' if group == "g1" else '{"error": "BrokerUnavailableError"}'
        print(answer, flush=True)
""")


class FakeProbe(GroupProbe):
    command = (sys.executable, "-c", FAKE_CHILD)


def test_a_child_that_aborts_loses_one_answer_and_the_next_question_gets_a_new_child(tmp_path):
    probe = FakeProbe({}, tmp_path / "probe.log")
    try:
        assert probe.members("g1") == (True, frozenset({"m1", "m2"}))
        assert probe.members("other") == (False, frozenset())  # the broker did not answer
        first = probe._child
        assert probe.members("boom") == (False, frozenset()) and probe.restarts == 1
        assert probe.members("g1") == (True, frozenset({"m1", "m2"}))
        assert probe._child is not first and probe.restarts == 1
    finally:
        probe.close()
    assert probe._child is None


def test_a_child_that_does_not_answer_in_time_is_replaced(tmp_path, monkeypatch):
    from turnlog.tools.demo import group_probe

    monkeypatch.setattr(group_probe, "ANSWER_TIMEOUT_SECONDS", 0.5)

    class SilentProbe(GroupProbe):
        command = (sys.executable, "-c", "import time; time.sleep(60)")

    probe = SilentProbe({}, tmp_path / "probe.log")
    try:
        assert probe.members("g1") == (False, frozenset()) and probe.restarts == 1
        assert probe._child is None
    finally:
        probe.close()
