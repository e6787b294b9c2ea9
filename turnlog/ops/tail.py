"""``turnlog tail``: follow one session in the terminal.

The same follower as the API's SSE stream (``turnlog.follow``): the stored
backlog, then the live tail from its own transcript hub. On a terminal a
partial turn is redrawn in place as it grows; otherwise each event is a line.
"""

from __future__ import annotations

import asyncio
import re
import sys
from typing import TextIO

import msgspec

from turnlog.follow import TranscriptHub, follow_session, store_fetch
from turnlog.settings import TurnlogSettings
from turnlog.sinks.base import SqlStore
from turnlog.sinks.reads import StoredEvent, get_session

__all__ = ["tail_session", "format_event"]


# C0 and C1 control characters (ESC, BEL, CR, ...): shown escaped, never sent to the terminal.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(text: object) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def format_event(event: StoredEvent) -> str:
    """One line for ``event``: ``[seq] speaker: text`` for turns, a note for session events.
    A partial ends in `` …``, a turn cut short by the other speaker in `` [cut off]``.
    Control characters in the event's text are shown escaped (``\\x1b``)."""
    body = {k: _printable(v) if isinstance(v, str) else v for k, v in msgspec.json.decode(event.payload).items()}
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
) -> bool:
    """Print ``session_id``'s events after ``after_seq`` until it ends. False if the store has no such session."""
    with store.engine.connect() as conn:
        if get_session(conn, session_id, fleets=None) is None:
            return False

    redraw = out.isatty()
    open_partial = False
    hub = TranscriptHub(settings)
    hub.start()
    try:
        async for event in follow_session(store_fetch(store), hub, session_id, after_seq,
                                          poll_seconds=settings.api_poll_seconds):
            line = format_event(event)
            if redraw and open_partial:
                out.write("\r\x1b[2K")  # overwrite the partial line
            if redraw and event.type == "turn.partial":
                out.write(line)
                open_partial = True
            else:
                out.write(line + "\n")
                open_partial = False
            out.flush()
    finally:
        await asyncio.to_thread(hub.stop)
    return True
