"""Retention (issue 21, item 3): the sweep on a store of sessions of several ages, fleets and
statuses (SQLite and Postgres), then on the real pipeline: `turnlog retention-sweep` and the
sink's own sweep forget exactly the sessions past their fleet's policy (settled ones by their end,
unsettled ones by the sink's last new event of them), end to end;
and `turnlog topics check` reports the log outliving the policy from the broker's configs."""

from __future__ import annotations

import datetime as dt
import subprocess
import uuid

from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from sqlalchemy import func, insert, select

from turnlog import kafka
from turnlog.deploy.processes import turnlog_command
from turnlog.deploy.topics import check_topics
from turnlog.kafka.log_retention import MS_PER_DAY, PolicyLimit
from turnlog.producers import SessionRecorder
from turnlog.schemas.erasure import Erasure
from turnlog.settings import TurnlogSettings
from turnlog.sinks.erasure_ledger import ErasureDuties
from turnlog.sinks.tables import erasures, session_events, sessions, transcript_turns

from tests.support import recorder_for, wait_until

TIMEOUT = 90
NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


def days_ago(days: float, now: dt.datetime = NOW) -> dt.datetime:
    return now - dt.timedelta(days=days)


def add_session(store, session_id: str, fleet: str, status: str, ended_days_ago: float | None,
                finalized_days_ago: float | None = None, applied_days_ago: float | None = None) -> None:
    """A session row as the sink leaves it: started an hour before it ended (or 400 days ago if it
    never ended), finalized when it ended unless ``finalized_days_ago`` says otherwise, its last
    event applied ``applied_days_ago`` (None: a day ago)."""
    ended = None if ended_days_ago is None else days_ago(ended_days_ago)
    started = (ended or days_ago(400)) - dt.timedelta(hours=1)
    finalized = days_ago(finalized_days_ago) if finalized_days_ago is not None else ended
    applied = days_ago(applied_days_ago if applied_days_ago is not None else 1)
    with store.engine.begin() as conn:
        conn.execute(insert(sessions).values(
            id=session_id, fleet=fleet, agent_id="a", status=status, epoch=0, last_seq=3, started_at=started,
            ended_at=ended, finalized_at=finalized if status == "finalized" else None, last_applied_at=applied,
        ))


def erasure_rows(store) -> dict[str, tuple[str, str, str]]:
    with store.engine.connect() as conn:
        rows = conn.execute(select(erasures.c.session_id, erasures.c.requested_by, erasures.c.reason,
                                   erasures.c.fleet)).all()
    return {row.session_id: (row.requested_by, row.reason, row.fleet) for row in rows}


def test_the_sweep_requests_exactly_the_sessions_past_their_fleets_policy(store):
    # Default 30 days; the fleet "brief" keeps 7, the fleet "long" 90.
    settings = TurnlogSettings(retention_days=30, retention_days_by_fleet={"brief": 7, "long": 90})
    sessions_by_id = {
        # (fleet, status, ended days ago): expired?
        "calls-finalized-40d": ("calls", "finalized", 40, True),
        "calls-abandoned-31d": ("calls", "abandoned", 31, True),
        "calls-finalized-20d": ("calls", "finalized", 20, False),
        "calls-ended-60d": ("calls", "ended", 60, False),  # not finalized yet: not settled
        "calls-active-60d": ("calls", "active", 60, False),
        "calls-active-open": ("calls", "active", None, False),
        "calls-abandoned-open": ("calls", "abandoned", None, False),  # never ended: no age to count
        "brief-finalized-8d": ("brief", "finalized", 8, True),
        "brief-finalized-6d": ("brief", "finalized", 6, False),
        "long-finalized-60d": ("long", "finalized", 60, False),
        "long-abandoned-100d": ("long", "abandoned", 100, True),
    }
    for session_id, (fleet, status, ended, _) in sessions_by_id.items():
        add_session(store, session_id, fleet, status, ended)
    # An agent's clock (or the agent) said the session ends in a year; the sink finalized it 35 days ago.
    add_session(store, "calls-finalized-35d-ends-next-year", "calls", "finalized", -365, finalized_days_ago=35)
    # Never settled: an agent that crashed and was never resumed, an end whose last turns never came.
    # Their age is the sink's last write of them (its clock), whatever the agent said.
    add_session(store, "calls-active-idle-45d", "calls", "active", None, applied_days_ago=45)
    add_session(store, "calls-ended-gap-idle-33d", "calls", "ended", 34, applied_days_ago=33)
    add_session(store, "calls-active-idle-10d", "calls", "active", None, applied_days_ago=10)
    add_session(store, "brief-active-idle-9d-ended-next-year", "brief", "active", -365, applied_days_ago=9)
    # Already asked for by a person: its erasure stands, not duplicated nor rewritten by the sweep.
    add_session(store, "calls-finalized-50d-requested", "calls", "finalized", 50)
    with store.engine.begin() as conn:
        store.erasures.request(conn, Erasure(session_id="calls-finalized-50d-requested", fleet="calls",
                                             requested_by="cli:alice", requested_at=days_ago(1), reason="request"))

    duties = ErasureDuties(settings, store)
    swept = duties.sweep_retention(NOW)

    # Oldest first: a settled session by ended_at, an unsettled one by its last applied event.
    assert swept == ["long-abandoned-100d", "calls-active-idle-45d", "calls-finalized-40d",
                     "calls-ended-gap-idle-33d", "calls-abandoned-31d", "brief-active-idle-9d-ended-next-year",
                     "brief-finalized-8d", "calls-finalized-35d-ends-next-year"]
    assert {sid for sid, (*_, expired) in sessions_by_id.items() if expired} <= set(swept)
    rows = erasure_rows(store)
    assert rows == {
        **{sid: ("retention", "retention", sid.split("-", 1)[0]) for sid in swept},
        "calls-finalized-50d-requested": ("cli:alice", "request", "calls"),
    }
    with store.engine.connect() as conn:
        assert {e.session_id for e in store.erasures.unpublished(conn)} == set(rows)
    # Idempotent: a second sweep (the sink's next round, or a cron run beside it) requests nothing.
    assert duties.sweep_retention(NOW) == []
    assert erasure_rows(store) == rows
    # A day later the brief fleet's 6-day session is past its 7 days; nothing else changes.
    assert duties.sweep_retention(NOW + dt.timedelta(days=1, hours=1)) == ["brief-finalized-6d"]


def test_the_sweep_uses_only_the_fleets_with_a_policy_and_bounded_batches(store):
    settings = TurnlogSettings(retention_days_by_fleet={"brief": 1})
    for n in range(5):
        add_session(store, f"brief-{n}", "brief", "finalized", 10 + n)
    add_session(store, "calls-old", "calls", "finalized", 1000)  # no policy for this fleet: kept
    default, by_fleet = None, {"brief": days_ago(1)}
    with store.engine.connect() as conn:
        assert store.erasures.expired(conn, default, by_fleet, limit=2) == [("brief-4", "brief"), ("brief-3", "brief")]
    assert ErasureDuties(settings, store).sweep_retention(NOW) == [f"brief-{n}" for n in (4, 3, 2, 1, 0)]
    assert "calls-old" not in erasure_rows(store)


def rows_of(store, session_id: str) -> tuple[int, int, int]:
    with store.engine.connect() as conn:
        return tuple(
            conn.execute(select(func.count()).select_from(table).where(column == session_id)).scalar_one()
            for table, column in ((sessions, sessions.c.id), (session_events, session_events.c.session_id),
                                  (transcript_turns, transcript_turns.c.session_id))
        )


def erasure_of(store, session_id: str):
    with store.engine.connect() as conn:
        return store.erasures.state(conn, session_id)


def status_of(store, session_id: str) -> str | None:
    with store.engine.connect() as conn:
        return conn.execute(select(sessions.c.status).where(sessions.c.id == session_id)).scalar()


async def record(recorder: SessionRecorder, local_id: str, fleet: str, ended_days_ago: float | None) -> str:
    """``fleet``'s session ``local_id`` of two turns that started an hour before it ended
    ``ended_days_ago`` days ago (None: 40 days ago, and never ended). Returns its key."""
    now = dt.datetime.now(dt.UTC)
    ended = None if ended_days_ago is None else now - dt.timedelta(days=ended_days_ago)
    started = (ended or now - dt.timedelta(days=40)) - dt.timedelta(hours=1)
    session = await recorder.start_session(local_id, fleet=fleet, agent_id="a", started_at=started)
    for turn in range(2):
        at = started + dt.timedelta(minutes=turn + 1)
        await session.complete_turn(turn, "user", f"turn {turn} of {local_id}", started_at=at,
                                    ended_at=at + dt.timedelta(seconds=20))
    if ended is not None:
        await session.end("hangup", ended_at=ended)
    assert await session.wait_acknowledged(TIMEOUT)
    return session.session_id


async def test_retention_sweep_command_and_the_sinks_own_sweep_forget_expired_sessions_end_to_end(new_pipeline):
    # The sink starts without a policy: only `turnlog retention-sweep` (given one) forgets at first.
    pipeline = new_pipeline(("sequencer", "sink"))
    settings, store = pipeline.settings, pipeline.store
    run = uuid.uuid4().hex[:6]
    async with recorder_for(settings) as recorder:
        old = await record(recorder, f"old-{run}", "tests", 40)
        mid = await record(recorder, f"mid-{run}", "tests", 10)
        brief = await record(recorder, f"brief-{run}", "brief", 2)
        fresh = await record(recorder, f"fresh-{run}", "tests", 1)
        open_old = await record(recorder, f"open-{run}", "tests", None)
        wait_until(lambda: all(status_of(store, sid) == "finalized" for sid in (old, mid, brief, fresh))
                   and rows_of(store, open_old)[2] == 2, timeout=TIMEOUT, what="sessions stored and finalized")

    def sweep(wait: float, **policy: str) -> int:
        done = subprocess.run(turnlog_command("retention-sweep", "--wait", str(wait)),
                              env={**settings.as_environment(), **policy}, capture_output=True, text=True,
                              timeout=wait + 120)
        return done.returncode

    # 30 days: the 40-day-old session is forgotten, and the command waits for it (exit 0).
    assert sweep(TIMEOUT, TURNLOG_RETENTION_DAYS="30") == 0
    assert rows_of(store, old) == (0, 0, 0)
    state = erasure_of(store, old)
    assert (state.status, state.requested_by, state.reason, state.fleet) == ("done", "retention", "retention", "tests")
    for kept in (mid, brief, fresh, open_old):
        assert erasure_of(store, kept) is None and rows_of(store, kept)[0] == 1
    # Again: nothing is due (exit 0); without any policy: refused (exit 2).
    assert sweep(0, TURNLOG_RETENTION_DAYS="30") == 0
    assert sweep(0) == 2

    # With no sink to apply it, the brief fleet's 1-day policy leaves its erasure pending (exit 3).
    pipeline.stop("sink")
    assert sweep(1, TURNLOG_RETENTION_DAYS_BY_FLEET='{"brief": 1}') == 3
    state = erasure_of(store, brief)
    assert (state.status, state.published_at is not None, state.requested_by) == ("pending", True, "retention")
    assert rows_of(store, brief)[0] == 1

    # The sink back with a policy of its own (5 days; the fleet "brief" 1 day): it applies the pending
    # erasure, and its own sweep forgets the 10-day-old session.
    pipeline.start("sink", env={"TURNLOG_RETENTION_DAYS": "5", "TURNLOG_RETENTION_DAYS_BY_FLEET": '{"brief": 1}'})
    pipeline.wait_ready()
    for forgotten, fleet in ((brief, "brief"), (mid, "tests")):
        state = wait_until(lambda sid=forgotten: (found := erasure_of(store, sid)) is not None
                           and found.status == "done" and found, timeout=TIMEOUT, what=f"{forgotten} forgotten")
        assert (state.requested_by, state.reason, state.fleet) == ("retention", "retention", fleet)
        assert rows_of(store, forgotten) == (0, 0, 0)
    # The session of yesterday (within 5 days) and the one that never ended stay whole.
    for kept in (fresh, open_old):
        assert erasure_of(store, kept) is None
        assert rows_of(store, kept)[0] == 1 and rows_of(store, kept)[2] == 2


def test_topics_check_reports_a_broker_retention_that_outlives_the_policy(transcript):
    settings, _ = transcript
    settings = settings.model_copy(update={"retention_days": 3.0})
    admin = kafka.admin(settings)
    # Someone set the DLQ to keep records forever on the broker.
    futures = admin.incremental_alter_configs([ConfigResource(
        ResourceType.TOPIC, settings.topics.dlq,
        incremental_configs=[ConfigEntry("retention.ms", "-1", incremental_operation=AlterConfigOpType.SET)],
    )])
    for future in futures.values():
        future.result()

    def applied() -> bool:  # the broker applies a config change a moment after it answers
        (described,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, settings.topics.dlq)]).values()
        return described.result(timeout=30)["retention.ms"].value == "-1"

    wait_until(applied, timeout=30, what="the DLQ's retention.ms=-1 applied")
    dry = check_topics(settings, fix=False)
    found = {(f.topic, f.source): f for f in dry.log_retention}
    # Settings: events and DLQ keep 30 days, the transcript 7, all past the 3-day policy; the broker's DLQ: forever.
    assert sorted(found) == sorted([(settings.topics.events, "settings"), (settings.topics.transcript, "settings"),
                                    (settings.topics.dlq, "settings"), (settings.topics.dlq, "broker")])
    assert found[settings.topics.dlq, "broker"].forever
    assert {f.limit for f in dry.log_retention} == {PolicyLimit.RETENTION_POLICY}
    assert {f.limit_ms for f in dry.log_retention} == {3 * MS_PER_DAY}

    # With the settings within the policy, a check that fixes the broker leaves no finding.
    within = settings.model_copy(update={"events_retention_ms": 3 * MS_PER_DAY, "transcript_retention_ms": MS_PER_DAY,
                                         "dlq_retention_ms": 2 * MS_PER_DAY})
    assert [(f.topic, f.source) for f in check_topics(within, fix=False).log_retention] == [
        (settings.topics.events, "broker"), (settings.topics.transcript, "broker"), (settings.topics.dlq, "broker"),
    ]
    fixed = check_topics(within, fix=True)
    assert fixed.ok and fixed.log_retention == ()
