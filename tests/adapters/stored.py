"""What the store holds of a session, for the adapter tests."""

from __future__ import annotations

from sqlalchemy import select

from turnlog.sinks.tables import transcript_turns


def turns(pipeline, session_id):  # noqa: ANN001
    """(turn_index, speaker, text, status, input_tokens, output_tokens, barged_in, tool_calls) in turn order."""
    t = transcript_turns.c
    with pipeline.store.engine.connect() as conn:
        rows = conn.execute(
            select(t.turn_index, t.speaker, t.text, t.status, t.input_tokens, t.output_tokens, t.barged_in, t.tool_calls)
            .where(t.session_id == session_id)
            .order_by(t.turn_index)
        ).all()
    return [tuple(row) for row in rows]
