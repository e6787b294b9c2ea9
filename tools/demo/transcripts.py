"""The demo's input: one JSON Lines file per session (see data/README.md).

Also the replay's conventions, shared by the agent (``demo/agent.py``) and the
verdict (``demo/verdict.py``):

- A turn's event timestamps are the recording's own times on a base date
  (:func:`recording_time`), so a stored turn names its input turn by
  ``(speaker, started_at)`` (:func:`turn_key`): no speaker starts two turns at
  the same instant (:func:`check_replayable`).
- The first agent of a session stores input turn ``i`` at turn index ``i``.
  An agent that resumes a session after a crash says again, in full, every
  input turn not stored complete (:func:`unfinished_turns`), in input order,
  at turn indexes counted on from the recorder's ``next_turn_index`` (one past
  the highest stored turn).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from pathlib import Path

import msgspec

from turnlog.exceptions import ConfigurationError
from turnlog.schemas import TurnStatus

__all__ = [
    "InputTurn",
    "load_transcript",
    "find_transcripts",
    "check_replayable",
    "AGENT_SPEAKER",
    "token_counts",
    "recording_time",
    "turn_key",
    "unfinished_turns",
]

#: In the replay, speaker "A" plays the agent: its words count as output tokens,
#: everyone else's as input tokens (a word is one token here).
AGENT_SPEAKER = "A"


class InputTurn(msgspec.Struct, frozen=True):
    """One line of a transcript file; times are seconds on the recording's clock."""

    session_id: str
    turn_index: int
    speaker: str
    text: str
    start_s: float
    end_s: float


_decoder = msgspec.json.Decoder(InputTurn)


def load_transcript(path: Path) -> list[InputTurn]:
    """The turns of one file, in file order.

    Raises:
        ConfigurationError: unreadable file, a malformed line (named by number),
            or turn indices that are not 0, 1, 2, ...
    """
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise ConfigurationError(f"cannot read transcript {path}: {e}") from e
    turns = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            turns.append(_decoder.decode(line))
        except msgspec.DecodeError as e:
            raise ConfigurationError(f"{path}:{number}: not a transcript turn: {e}") from e
    if [t.turn_index for t in turns] != list(range(len(turns))):
        raise ConfigurationError(f"{path}: turn_index must run 0, 1, 2, ... in file order")
    if not turns:
        raise ConfigurationError(f"{path}: no turns")
    return turns


def find_transcripts(folder: Path) -> list[Path]:
    """The ``*.jsonl`` files of ``folder``, sorted by name.

    Raises:
        ConfigurationError: the folder is missing or holds no ``.jsonl`` file.
    """
    if not folder.is_dir():
        raise ConfigurationError(f"no sessions folder at {folder} (use --sessions DIR)")
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise ConfigurationError(f"{folder} holds no *.jsonl transcripts")
    return files


def token_counts(turn: InputTurn) -> tuple[int, int]:
    """``(input_tokens, output_tokens)`` the replay records for ``turn``."""
    words = len(turn.text.split())
    return (0, words) if turn.speaker == AGENT_SPEAKER else (words, 0)


def recording_time(base: dt.datetime, seconds: float) -> dt.datetime:
    """The event timestamp of ``seconds`` on the recording's clock (``base`` is its second 0)."""
    return base + dt.timedelta(seconds=seconds)


def turn_key(speaker: str, started_at: dt.datetime) -> tuple[str, dt.datetime]:
    """What names an input turn in the store: its speaker and its start (UTC)."""
    return speaker, started_at.astimezone(dt.UTC)


def check_replayable(path: Path, turns: list[InputTurn]) -> None:
    """Refuse a transcript in which one speaker starts two turns at the same
    instant: their stored turns could not be told apart (:func:`turn_key`).

    Raises:
        ConfigurationError: naming the first such pair.
    """
    seen: dict[tuple[str, float], int] = {}
    for turn in turns:
        other = seen.setdefault((turn.speaker, turn.start_s), turn.turn_index)
        if other != turn.turn_index:
            raise ConfigurationError(
                f"{path}: turns {other} and {turn.turn_index} are both spoken by {turn.speaker!r} from {turn.start_s} s"
            )


def unfinished_turns(
    turns: list[InputTurn], stored: Iterable[tuple[str, dt.datetime, str]], base: dt.datetime
) -> list[InputTurn]:
    """The input turns a resumed agent says again: those without a stored
    ``complete`` turn, in input order. ``stored`` gives each stored turn's
    ``(speaker, started_at, status)``; a stored turn that names no input turn
    is ignored here (the verdict reports it)."""
    complete = {
        turn_key(speaker, started_at) for speaker, started_at, status in stored if status == TurnStatus.COMPLETE
    }
    return [t for t in turns if turn_key(t.speaker, recording_time(base, t.start_s)) not in complete]
