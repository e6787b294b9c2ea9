"""The crash test the LangGraph and OpenAI Agents adapters share: an agent script
(``tests/adapters/langgraph_script.py``, ``tests/adapters/openai_agents_script.py``)
SIGKILLed mid-answer, then a second process that resumes its conversation.

Both scripts hold the same conversation, so what the store holds after it is the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from turnlog.settings import TurnlogSettings

from tests.progress import ScriptProcess

#: ``(turn_index, speaker, text, status, input_tokens, output_tokens)`` of the stored turns.
TURNS_AFTER_A_KILL_MID_ANSWER = [
    (0, "user", "question 0", "complete", 0, 0),
    (1, "assistant", "answer 0", "complete", 10, 2),
    (2, "user", "question 1", "complete", 0, 0),
    (3, "assistant", "answer 1", "complete", 11, 2),
    (4, "user", "question 2", "complete", 0, 0),
    (5, "assistant", "answer 2 is on ", "interrupted", 0, 0),  # the words flushed before the kill
    (6, "user", "question 3", "complete", 0, 0),
    (7, "assistant", "answer 3", "complete", 13, 2),
]


def kill_mid_answer_then_resume(module: str, session_id: str, settings: TurnlogSettings, log_dir: Path, timeout: float) -> dict[str, Any]:
    """``python -m <module> first <session>`` SIGKILLed once it reports ``streaming`` (the third
    answer's first words flushed and acknowledged), then ``python -m <module> second <session>``
    run to its successful end; returns the second's ``done`` line (what its model was shown)."""
    env = settings.as_environment()
    first = ScriptProcess(module, "first", session_id, env=env, log_path=log_dir / "agent-first.log", name="agent-first")
    first.first_with("streaming", timeout)
    first.process.kill()

    second = ScriptProcess(module, "second", session_id, env=env, log_path=log_dir / "agent-second.log", name="agent-second")
    done = second.first_with("done", timeout)
    assert second.process.popen.wait(timeout) == 0, second.log_tail()
    return done
