"""The session and turn statuses (``schemas/statuses.py``): their values are the
store's and the API's, and a member reaches the database as that string."""

from __future__ import annotations

import msgspec
import pytest
from psycopg.adapt import PyFormat, Transformer
from psycopg.types.enum import EnumBinaryDumper, EnumDumper
from sqlalchemy import create_engine, insert, select

from turnlog.schemas import SETTLED_SESSION_STATUSES, SessionStatus, TurnStatus
from turnlog.sinks.batch import TURN_COMPLETE, TURN_INTERRUPTED, TURN_PARTIAL
from turnlog.sinks.tables import metadata, sessions, transcript_turns


def test_the_values_are_the_stored_strings():
    # docs/design.md, "Store": what rows written before these enums hold, and what API clients filter on.
    assert [s.value for s in SessionStatus] == ["active", "ended", "finalized", "abandoned"]
    assert [s.value for s in TurnStatus] == ["partial", "complete", "interrupted"]
    assert tuple(TurnStatus) == (TURN_PARTIAL, TURN_COMPLETE, TURN_INTERRUPTED)
    assert SETTLED_SESSION_STATUSES == (SessionStatus.FINALIZED, SessionStatus.ABANDONED)


def test_every_value_fits_its_column():
    assert max(len(s) for s in SessionStatus) <= sessions.c.status.type.length
    assert max(len(s) for s in TurnStatus) <= transcript_turns.c.status.type.length


@pytest.mark.parametrize("status", [*SessionStatus, *TurnStatus])
def test_psycopg_sends_a_member_as_its_value_not_its_name(status):
    # psycopg dumps a plain Enum by its *name*; a StrEnum must take the str dumper (str comes first in its MRO).
    dumper = Transformer().get_dumper(status, PyFormat.AUTO)
    assert bytes(dumper.dump(status)) == status.value.encode()
    assert not isinstance(dumper, (EnumDumper, EnumBinaryDumper))


def test_a_member_binds_and_compares_as_its_string_in_sql():
    engine = create_engine("sqlite://")
    metadata.create_all(engine, tables=[sessions])
    with engine.begin() as conn:
        conn.execute(insert(sessions).values(id="s", status=SessionStatus.ENDED, epoch=0, last_seq=-1))
        stored = conn.execute(select(sessions.c.status).where(sessions.c.status == SessionStatus.ENDED)).scalar_one()
        other = conn.execute(select(sessions.c.id).where(sessions.c.status == SessionStatus.ACTIVE)).all()
    assert type(stored) is str and stored == "ended" == SessionStatus.ENDED
    assert other == []


def test_a_member_encodes_as_its_value_in_json():
    assert msgspec.json.encode({"status": SessionStatus.FINALIZED, "turn": TurnStatus.INTERRUPTED}) == (
        b'{"status":"finalized","turn":"interrupted"}'
    )
    assert f"{SessionStatus.ENDED}" == "ended"  # as the bench's SQL text embeds it
