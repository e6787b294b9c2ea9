"""What the store holds of a session, for the adapter tests."""

from __future__ import annotations

from sqlalchemy import select

from turnlog.sinks.tables import transcript_turns

#: The fleet the adapter tests and their agent scripts record in: the framework's id ``X`` (a room,
#: a thread, an inner session) is stored, logged and looked up as ``session_key(FLEET, X)``.
FLEET = "tests"


def turns(pipeline, key):  # noqa: ANN001
    """(turn_index, speaker, text, status, input_tokens, output_tokens, barged_in, tool_calls) in turn
    order, of the session keyed ``key``."""
    t = transcript_turns.c
    with pipeline.store.engine.connect() as conn:
        rows = conn.execute(
            select(t.turn_index, t.speaker, t.text, t.status, t.input_tokens, t.output_tokens, t.barged_in, t.tool_calls)
            .where(t.session_id == key)
            .order_by(t.turn_index)
        ).all()
    return [tuple(row) for row in rows]
