"""The unsafe baseline: an agent backend that holds the session in memory and writes it once, at the end.

``python -m turnlog.tools.bench.unsafe DSN SESSIONS_DIR SESSION_ID TURNS SPEED [--count-only]``
replays the first transcript's first TURNS turns at SPEED, printing ``said N``
after each turn, and then writes the session row and every turn in one
transaction. ``--count-only`` replays without waiting and prints
``COMMITS ROWS SECONDS`` (SECONDS: the replay's length at SPEED).
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from pathlib import Path

import psycopg

from turnlog.schemas import SessionStatus, TurnStatus
from turnlog.tools.bench.workload import plan_sessions


def main() -> None:
    dsn, sessions_dir, session_id, turns, speed = sys.argv[1:6]
    count_only = "--count-only" in sys.argv[6:]
    plan = plan_sessions(Path(sessions_dir), 1, int(turns))[0]
    pace = float(speed)
    held: list[tuple[object, ...]] = []  # the whole transcript, only in memory
    began = time.monotonic()
    t0 = plan.turns[0].start_s
    for index, turn in enumerate(plan.turns):
        if not count_only:
            time.sleep(max(0.0, began + (max(turn.end_s, turn.start_s) - t0) / pace - time.monotonic()))
        now = dt.datetime.now(dt.UTC)
        held.append((session_id, index, turn.speaker, turn.text, TurnStatus.COMPLETE, now, now, 0, 0, 0, index))
        print(f"said {index + 1}", flush=True)
    with psycopg.connect(dsn) as conn:  # one transaction at the end: all or nothing
        conn.execute(
            "INSERT INTO sessions (id, status, epoch, last_seq, claimed_epoch)"
            f" VALUES (%s, '{SessionStatus.ENDED}', 0, %s, 0)",
            (session_id, len(held) - 1),
        )
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO transcript_turns (session_id, turn_index, speaker, text, status, started_at, ended_at,"
                " input_tokens, output_tokens, epoch, seq) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                held,
            )
    if count_only:
        print(1, len(held) + 1, plan.seconds(pace))


if __name__ == "__main__":
    main()
