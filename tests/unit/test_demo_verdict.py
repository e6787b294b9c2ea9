"""The demo's verdict on overlapping turns, crashes and resumes (pure: no store).

The stored turns of a healthy run are built with the agent's own conventions
(``replay_plan``, ``unfinished_turns``) by :func:`simulate`; each failure test
then damages them in one way and checks that the verdict names exactly that.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import msgspec
import pytest

from turnlog.exceptions import ConfigurationError
from turnlog.tools.demo.agent import replay_plan
from turnlog.tools.demo.transcripts import InputTurn, check_replayable, recording_time, unfinished_turns
from turnlog.tools.demo.verdict import Problem, ProblemKind, VerdictTurn, check_turns, problem_totals

from tests.unit.demo_turns import OVERLAPPING_TURNS

BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def simulate(turns: list[InputTurn], kills: list[float]) -> list[VerdictTurn]:
    """The stored turns of a replay whose agent is SIGKILLed at each recording
    time in ``kills``, every open turn of several words having had its first
    partial flushed (a one-word turn has no partial: it leaves no row)."""
    rows: dict[int, VerdictTurn] = {}
    epoch, first, todo = 0, 0, turns
    for kill in [*kills, None]:
        if todo:
            offset = todo[0].start_s  # a resumed agent replays from its first unfinished turn...
            shift = (kill - offset) if kill is not None else None
        for spoken in replay_plan(todo, first_turn_index=first):
            t = spoken.turn
            start, end = t.start_s - offset, t.end_s - offset  # ...on its own clock
            if shift is not None and start >= shift:
                continue  # not started when killed
            status = "complete" if shift is None or end <= shift else "partial"
            words = t.text.split(" ")
            if status == "partial" and len(words) == 1:
                continue
            text = t.text if status == "complete" else words[0]
            rows[spoken.turn_index] = VerdictTurn(spoken.turn_index, t.speaker, text, status, recording_time(BASE, t.start_s), epoch)
        if kill is None:
            break
        for index, row in rows.items():  # the next epoch's first event marks them
            if row.status == "partial":
                rows[index] = dataclasses.replace(row, status="interrupted")
        stored = [(r.speaker, r.started_at, r.status) for r in rows.values()]
        todo = unfinished_turns(turns, stored, BASE)
        epoch, first = epoch + 1, max(rows) + 1
        kills = kills[1:]
    return list(rows.values())


def kinds(problems: list[Problem]) -> dict[ProblemKind, int]:
    return {kind: n for kind, n in problem_totals(problems).items() if n}


def test_a_replay_without_kills_stores_input_turn_i_at_index_i():
    rows = simulate(OVERLAPPING_TURNS, [])
    assert [(r.turn_index, r.text) for r in sorted(rows, key=lambda r: r.turn_index)] == [(t.turn_index, t.text) for t in OVERLAPPING_TURNS]
    assert check_turns(rows, OVERLAPPING_TURNS, base_time=BASE, kills=0) == []


def test_a_kill_with_two_turns_open_leaves_one_interrupted_and_the_resumed_agent_says_both_again():
    rows = simulate(OVERLAPPING_TURNS, [11.2])  # 0 and 1 have ended, 2 and 3 are open, 4 and 5 to come
    by_index = {r.turn_index: r for r in rows}
    # epoch 0: turns 0 and 1 complete; 2 interrupted; 3 ("right", one word) left nothing
    assert [(i, by_index[i].status) for i in range(3)] == [(0, "complete"), (1, "complete"), (2, "interrupted")]
    assert 3 not in {r.turn_index for r in rows if r.epoch == 0}
    # epoch 1 starts after the highest stored index (2) and says 2, 3, 4, 5 again in input order
    assert [(r.turn_index, r.text) for r in sorted(rows, key=lambda r: r.turn_index) if r.epoch == 1] == [
        (3, OVERLAPPING_TURNS[2].text), (4, OVERLAPPING_TURNS[3].text), (5, OVERLAPPING_TURNS[4].text), (6, OVERLAPPING_TURNS[5].text),
    ]
    assert check_turns(rows, OVERLAPPING_TURNS, base_time=BASE, kills=1) == []


def test_two_kills_in_a_row_still_pass_and_overlapping_turns_may_leave_several_interrupted():
    rows = simulate(OVERLAPPING_TURNS, [4.5, 6.0])
    assert sum(r.status == "interrupted" for r in rows) >= 3
    assert check_turns(rows, OVERLAPPING_TURNS, base_time=BASE, kills=2) == []


def test_a_lost_complete_turn_is_reported_as_lost():
    rows = [r for r in simulate(OVERLAPPING_TURNS, [11.2]) if r.turn_index != 1]
    assert kinds(check_turns(rows, OVERLAPPING_TURNS, base_time=BASE, kills=1)) == {ProblemKind.LOST_TURNS: 1}


def test_a_turn_said_again_although_it_was_stored_complete_is_a_duplicate():
    rows = simulate(OVERLAPPING_TURNS, [11.2])
    again = dataclasses.replace(next(r for r in rows if r.turn_index == 1), turn_index=7, epoch=1)
    assert kinds(check_turns([*rows, again], OVERLAPPING_TURNS, base_time=BASE, kills=1)) == {ProblemKind.DUPLICATED_TURNS: 1}


def test_two_turns_swapped_in_the_store_are_out_of_order():
    rows = simulate(OVERLAPPING_TURNS, [])
    swapped = [
        dataclasses.replace(r, turn_index={1: 2, 2: 1}.get(r.turn_index, r.turn_index)) for r in rows
    ]
    assert kinds(check_turns(swapped, OVERLAPPING_TURNS, base_time=BASE, kills=0)) == {ProblemKind.OUT_OF_ORDER: 2}


def test_a_resumed_agent_that_reuses_a_stored_index_range_is_out_of_order():
    rows = simulate(OVERLAPPING_TURNS, [11.2])
    shifted = [dataclasses.replace(r, turn_index=r.turn_index + 10) if r.epoch == 1 else r for r in rows]
    assert kinds(check_turns(shifted, OVERLAPPING_TURNS, base_time=BASE, kills=1)) == {ProblemKind.OUT_OF_ORDER: 4}


def test_an_altered_text_is_altered_not_lost():
    rows = [dataclasses.replace(r, text=r.text + " !") if r.turn_index == 4 else r for r in simulate(OVERLAPPING_TURNS, [])]
    assert kinds(check_turns(rows, OVERLAPPING_TURNS, base_time=BASE, kills=0)) == {ProblemKind.ALTERED_TURNS: 1}


def test_a_turn_whose_start_time_changed_names_no_input_turn():
    rows = [
        dataclasses.replace(r, started_at=r.started_at + dt.timedelta(milliseconds=1)) if r.turn_index == 4 else r
        for r in simulate(OVERLAPPING_TURNS, [])
    ]
    assert kinds(check_turns(rows, OVERLAPPING_TURNS, base_time=BASE, kills=0)) == {ProblemKind.ALTERED_TURNS: 1, ProblemKind.LOST_TURNS: 1}


def test_an_interrupted_turn_must_hold_a_word_prefix_of_its_turn():
    rows = simulate(OVERLAPPING_TURNS, [11.2])
    cut = next(r for r in rows if r.status == "interrupted")
    assert check_turns(rows, OVERLAPPING_TURNS, base_time=BASE, kills=1) == []
    for text in ("an", "and cheap to make I think more"):  # not on a word boundary; longer than the turn
        damaged = [dataclasses.replace(r, text=text) if r is cut else r for r in rows]
        assert kinds(check_turns(damaged, OVERLAPPING_TURNS, base_time=BASE, kills=1)) == {ProblemKind.BAD_INTERRUPTED: 1}


def test_an_interrupted_turn_in_the_last_generation_was_never_said_again():
    rows = simulate(OVERLAPPING_TURNS, [])
    rows = [dataclasses.replace(r, status="interrupted", text=r.text.split(" ")[0]) if r.turn_index == 5 else r for r in rows]
    assert kinds(check_turns(rows, OVERLAPPING_TURNS, base_time=BASE, kills=0)) == {ProblemKind.BAD_INTERRUPTED: 1, ProblemKind.LOST_TURNS: 1}


def test_a_partial_left_after_the_end_and_extra_writers_are_reported():
    rows = simulate(OVERLAPPING_TURNS, [11.2])
    cut = next(r for r in rows if r.status == "interrupted")
    partial = [dataclasses.replace(r, status="partial") if r is cut else r for r in rows]
    assert ProblemKind.PARTIAL_AFTER_END in kinds(check_turns(partial, OVERLAPPING_TURNS, base_time=BASE, kills=1))
    assert kinds(check_turns(rows, OVERLAPPING_TURNS, base_time=BASE, kills=0)) == {ProblemKind.EXTRA_GENERATIONS: 1}


def test_problem_totals_add_counts_by_kind():
    problems = [Problem(ProblemKind.LOST_TURNS, 3, "3 lost"), Problem(ProblemKind.LOST_TURNS, 2, "2 lost"), Problem(ProblemKind.OUT_OF_ORDER, 1, "x")]
    totals = problem_totals(problems)
    assert totals[ProblemKind.LOST_TURNS] == 5 and totals[ProblemKind.OUT_OF_ORDER] == 1 and totals[ProblemKind.DUPLICATED_TURNS] == 0
    assert str(problems[0]) == "3 lost" and problems[0].as_json() == {"kind": "lost_turns", "count": 3, "detail": "3 lost"}


def test_unfinished_turns_are_those_without_a_complete_stored_turn_in_input_order():
    stored = [
        ("A", recording_time(BASE, 0.0), "complete"),
        ("C", recording_time(BASE, 4.0), "interrupted"),
        ("B", recording_time(BASE, 2.0), "complete"),
        ("B", recording_time(BASE, 11.0), "partial"),
    ]
    assert [t.turn_index for t in unfinished_turns(OVERLAPPING_TURNS, stored, BASE)] == [2, 3, 4, 5]
    assert replay_plan(unfinished_turns(OVERLAPPING_TURNS, stored, BASE), first_turn_index=9)[0].turn_index == 9


def test_a_speaker_starting_two_turns_at_once_cannot_be_replayed():
    check_replayable(Path("ok.jsonl"), OVERLAPPING_TURNS)
    with pytest.raises(ConfigurationError, match="turns 1 and 3"):
        check_replayable(Path("bad.jsonl"), [*OVERLAPPING_TURNS[:3], msgspec.structs.replace(OVERLAPPING_TURNS[3], start_s=2.0)])
