"""What readers see of the store's rows is listed, not derived: a new column reaches the API,
the resume grant and ``turnlog verify`` only once it is added to these lists on purpose."""

from turnlog.sinks.reads import SESSION_FIELDS, TURN_FIELDS
from turnlog.sinks.tables import sessions, transcript_turns

#: Columns kept from readers: the key a turn row shares with its session, and bookkeeping.
TURN_INTERNAL = {"session_id"}
SESSION_INTERNAL = {"claimed_epoch", "max_seq", "last_applied_at"}


def test_every_turn_column_is_shown_or_kept_internal_on_purpose():
    assert {c.name for c in transcript_turns.c} == set(TURN_FIELDS) | TURN_INTERNAL
    assert len(set(TURN_FIELDS)) == len(TURN_FIELDS)


def test_every_session_column_is_shown_or_kept_internal_on_purpose():
    assert {c.name for c in sessions.c} == set(SESSION_FIELDS) | SESSION_INTERNAL
