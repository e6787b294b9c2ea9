"""The statuses of a stored session and of a stored turn, defined once.

They are the values of ``sessions.status`` and ``transcript_turns.status``
(docs/design.md, "Store") and travel in the API's answers and in a resume grant.
Each is a :class:`~enum.StrEnum`: a member *is* its string, so it compares
equal to the value read from the database or from JSON, binds as that string
in SQL (SQLAlchemy, psycopg and sqlite3 send ``"ended"`` for
``SessionStatus.ENDED``) and encodes as it in JSON.

They live beside the event model because the producer side (a resume grant,
``producers/grant.py``) reads them without the store's dependencies.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["SessionStatus", "TurnStatus", "SETTLED_SESSION_STATUSES"]


class SessionStatus(StrEnum):
    """``sessions.status``. It only moves forward: active -> ended -> finalized;
    abandoned is set by an operator and stays."""

    #: Started, not ended: the only status a resume may claim an epoch of.
    ACTIVE = "active"
    #: Its ``session.ended`` is applied; finalized once every seq up to ``end_seq`` is.
    ENDED = "ended"
    #: Aggregates computed, once, by the guarded finalize.
    FINALIZED = "finalized"
    #: Given up by an operator; never finalized, never resumed.
    ABANDONED = "abandoned"


#: Statuses a batch never changes again (the sessions upsert keeps them; replay leaves such sessions alone).
SETTLED_SESSION_STATUSES: Final = (SessionStatus.FINALIZED, SessionStatus.ABANDONED)


class TurnStatus(StrEnum):
    """``transcript_turns.status``."""

    #: The whole text so far of an unfinished turn.
    PARTIAL = "partial"
    #: A completed turn (also one cut short by the other speaker: ``barged_in``).
    COMPLETE = "complete"
    #: Never completed: its writer died or its session ended first.
    INTERRUPTED = "interrupted"
