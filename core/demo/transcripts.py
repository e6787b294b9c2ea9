"""The demo's input: one JSON Lines file per session (see shared/data/README.md)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from turnlog.exceptions import ConfigurationError

__all__ = ["InputTurn", "load_transcript", "find_transcripts", "AGENT_SPEAKER", "token_counts"]

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
