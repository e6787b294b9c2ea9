"""The recorded meeting the demo's unit tests replay (agent timing, verdict)."""

from __future__ import annotations

from turnlog.tools.demo.transcripts import InputTurn


def turn(index: int, speaker: str, text: str, start: float, end: float) -> InputTurn:
    return InputTurn("s", index, speaker, text, start, end)


# Overlapping speech: turn 0 is open while 1, 2 and 3 start; ends fall in the order 1, 0, 3, 2, 4, 5;
# turns 1 and 3 are one word each (a one-word turn has no partial).
OVERLAPPING_TURNS = [
    turn(0, "A", "so the remote control should be easy to use", 0.0, 10.0),
    turn(1, "B", "yeah", 2.0, 3.0),
    turn(2, "C", "and cheap to make I think", 4.0, 12.0),
    turn(3, "B", "right", 11.0, 11.5),
    turn(4, "A", "okay let us move on to the next point then", 13.0, 20.0),
    turn(5, "C", "fine by me", 19.0, 22.0),
]
