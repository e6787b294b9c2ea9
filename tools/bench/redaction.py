"""The CPU cost of redaction before persistence (``turnlog/producers/pii.py``), on the workload's texts.

In this process (``time.process_time``, so other processes on the cores do not count), best of
``rounds``: the built-in :class:`~turnlog.producers.pii.PatternRedactor` on every completed turn's text
(``redactor(text)``) and on every partial's (``redact_partial``, the stricter rule the recorder applies
once per flush), against what the recorder already spends per event to encode and validate it
(``encode_event`` of the decoded event, then ``decode_event``). Microseconds of CPU per event.

Standalone: ``python -m turnlog.tools.bench.redaction [--sessions data/sessions]`` prints the figures
for the demo's transcripts (60 sessions of 40 turns, partials every 0.5 s of speech).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from turnlog.producers.pii import PatternRedactor
from turnlog.schemas import TurnCompleted, TurnPartial, decode_event, encode_event

__all__ = ["redaction_cost"]


def _best_us(work: Callable[[], object], count: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best * 1e6 / max(count, 1)


def redaction_cost(payloads: Sequence[tuple[str, bytes]], *, rounds: int = 3) -> dict[str, Any]:
    """CPU microseconds per event of the pattern redactor (module docstring).

    ``payloads``: ``[(session_id, event bytes)]``. Returns ``completed_us`` and ``partial_us`` (per
    completed turn and per partial redacted), ``encode_validate_us`` (per event, all types),
    ``per_event_us`` (redaction's cost averaged over all events), its ratio to encode+validate, the
    event counts, and the mean text length of each kind (characters).
    """
    events = [decode_event(value) for _, value in payloads]
    completed = [event.text for event in events if isinstance(event, TurnCompleted)]
    partials = [event.text for event in events if isinstance(event, TurnPartial)]
    redactor = PatternRedactor()

    def redact_completed() -> None:
        for text in completed:
            redactor(text)

    def redact_partials() -> None:
        for text in partials:
            redactor.redact_partial(text)

    def validate() -> None:
        for event in events:
            decode_event(encode_event(event))

    completed_us = _best_us(redact_completed, len(completed), rounds)
    partial_us = _best_us(redact_partials, len(partials), rounds)
    validate_us = _best_us(validate, len(events), rounds)
    per_event = (completed_us * len(completed) + partial_us * len(partials)) / max(len(events), 1)
    return {
        "completed_us": completed_us,
        "partial_us": partial_us,
        "encode_validate_us": validate_us,
        "per_event_us": per_event,
        "per_event_over_encode_validate": per_event / validate_us if validate_us else float("nan"),
        "events": len(events),
        "completed_turns": len(completed),
        "partials": len(partials),
        "completed_mean_chars": sum(map(len, completed)) / max(len(completed), 1),
        "partial_mean_chars": sum(map(len, partials)) / max(len(partials), 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    from turnlog.tools.bench.workload import encoded_events, plan_sessions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=Path, default=Path("data/sessions"))
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--turns", type=int, default=40)
    args = parser.parse_args(argv)
    plans = plan_sessions(args.sessions, args.count, args.turns)
    print(json.dumps(redaction_cost(encoded_events(plans, flush_interval=0.5, speed=1.0)), indent=2))


if __name__ == "__main__":
    main()
