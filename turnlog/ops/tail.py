"""``turnlog tail``: follow one session in the terminal.

The same follower as the API's SSE stream (``turnlog.follow``): the stored
backlog, then the live tail from its own transcript hub. On a terminal a
partial turn is redrawn in place as it grows; otherwise each event is a line.

An event that cannot be shown (its payload is not JSON, is nested deeper than
any event may be, or lacks a field its line needs) is skipped: a warning names
its session and seq (never its content), and the count comes back in
:class:`TailResult` (the command prints it).

A session forgotten while it is tailed (or before) ends the tail at once:
nothing more of it is printed, an open partial line is wiped, and
:class:`TailResult` says ``erased``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from dataclasses import dataclass
from typing import Any, TextIO

import msgspec

from turnlog.follow import SessionErased, TranscriptHub, follow_session, store_fetch
from turnlog.schemas import EventValidationError
from turnlog.schemas.events import MAX_EVENT_DEPTH, nesting_exceeds
from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import SqlStore
from turnlog.sinks.reads import StoredEvent

__all__ = ["TailResult", "tail_session", "format_event"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TailResult:
    """What a tail did: ``found`` False if the store had no such session; ``skipped``:
    events that could not be shown; ``erased``: it ended because the session is forgotten."""

    found: bool
    skipped: int = 0
    erased: bool = False


# C0 and C1 control characters (ESC, BEL, CR, ...): shown escaped, never sent to the terminal.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(text: object) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def _payload_object(payload: str) -> dict[str, Any]:
    """The payload's JSON object, its nesting checked before msgspec (which recurses) decodes it.

    Raises:
        EventValidationError: not a JSON object, or nested deeper than ``MAX_EVENT_DEPTH``.
    """
    raw = payload.encode("utf-8", "surrogatepass")
    if nesting_exceeds(raw, MAX_EVENT_DEPTH):
        raise EventValidationError(f"the event's JSON nests deeper than {MAX_EVENT_DEPTH} levels")
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise EventValidationError(str(e)) from e
    if not isinstance(body, dict):
        raise EventValidationError("the event is not a JSON object")
    return body


def format_event(event: StoredEvent) -> str:
    """One line for ``event``: ``[seq] speaker: text`` for turns, a note for session events.
    A partial ends in `` …``, a turn cut short by the other speaker in `` [cut off]``.
    Control characters in the event's text are shown escaped (``\\x1b``).

    Raises:
        EventValidationError: the payload is not a JSON object or nests deeper than an event may.
        KeyError: the payload lacks a field the line needs.
    """
    body = {k: _printable(v) if isinstance(v, str) else v for k, v in _payload_object(event.payload).items()}
    if event.type == "session.started":
        return (f"[{event.seq}] -- session {body['session_id']} started "
                f"(fleet {body['fleet']}, agent {body['agent_id']})")
    if event.type == "session.ended":
        return f"[{event.seq}] -- session ended: {body['reason']}"
    if event.type != "turn.completed":
        marker = " …"
    elif body.get("barged_in") is True:  # barge-in: the other speaker cut in
        marker = " [cut off]"
    else:
        marker = ""
    return f"[{event.seq}] #{body['turn_index']} {body['speaker']}: {body['text']}{marker}"


async def tail_session(
    settings: TurnlogSettings, store: SqlStore, session_id: str, after_seq: int = -1, *, out: TextIO = sys.stdout
) -> TailResult:
    """Print ``session_id``'s events after ``after_seq`` until it ends.

    An event that cannot be formatted (any exception from :func:`format_event`) is
    skipped with a warning naming its session and seq, and counted in ``skipped``.
    """
    with store.reading() as reads:
        if reads.session(session_id, fleets=None) is None:
            return TailResult(found=False)

    redraw = out.isatty()
    open_partial = False
    skipped = 0
    erased = False
    hub = TranscriptHub(settings, store=store)
    hub.start()
    try:
        async for event in follow_session(store_fetch(store), hub, session_id, after_seq,
                                          poll_seconds=settings.api_poll_seconds):
            try:
                line = format_event(event)
            except Exception as e:  # one event that cannot be shown must not end the tail
                skipped += 1
                reason = e.reason if isinstance(e, EventValidationError) else type(e).__name__
                logger.warning("session %s seq %d cannot be shown (%s): skipped", session_id, event.seq, reason)
                continue
            if redraw and open_partial:
                out.write("\r\x1b[2K")  # overwrite the partial line
            if redraw and event.type == "turn.partial":
                out.write(line)
                open_partial = True
            else:
                out.write(line + "\n")
                open_partial = False
            out.flush()
    except SessionErased:
        erased = True
        if redraw and open_partial:
            out.write("\r\x1b[2K")  # the forgotten session's last partial does not stay on screen
            out.flush()
    finally:
        await asyncio.to_thread(hub.stop)
    return TailResult(found=True, skipped=skipped, erased=erased)
