"""The analytics projection on SQLite and Postgres: figures, idempotence, the shared offset frame."""

from turnlog.sinks import SourceMessage
from turnlog.sinks.analytics import UNKNOWN_FLEET, AnalyticsProjection

from tests.support import BASE, EventFactory, messages

GROUP = "analytics-test"


def project(store, batch, group=GROUP):
    with store.engine.begin() as conn:
        return store.offsets.apply_tracked(conn, group, batch, AnalyticsProjection(store).write)


def figures(store, fleet="tests"):
    with store.engine.connect() as conn:
        return AnalyticsProjection(store).figures(conn, fleet)


def two_sessions():
    a, b = EventFactory(), EventFactory()
    return a, b, [
        a.started(),
        b.started(),
        a.completed(1, 0, "hello", speaker="agent"),
        a.completed(2, 1, "hi there", speaker="user"),
        b.partial(1, 0, "one mo"),
        a.completed(3, 2, "how can I help", speaker="agent"),
        a.ended(4, last_turn=2),
    ]


def test_figures_count_sessions_turns_and_talk_time(store):
    _, _, events = two_sessions()
    result = project(store, messages(events))
    assert (result.applied, result.stale, result.rejected) == (7, 0, 0)
    got = figures(store)
    assert (got.started_sessions, got.ended_sessions, got.active_sessions) == (2, 1, 1)
    # EventFactory's turns last 0.9 s and end in the first minute of BASE.
    assert got.turns_per_minute == [(BASE.replace(second=0), 3)]
    assert got.talk_time == {"agent": (2, 1.8), "user": (1, 0.9)}


def test_a_batch_below_the_stored_offsets_changes_nothing(store):
    _, _, events = two_sessions()
    batch = messages(events)
    project(store, batch)
    before = figures(store)
    again = project(store, batch)
    assert (again.applied, again.stale) == (0, 7)
    assert figures(store) == before


def test_events_repeated_at_new_offsets_are_counted_once(store):
    # The sequencer may re-emit events after a restart: new offsets, same events.
    _, _, events = two_sessions()
    project(store, messages(events))
    before = figures(store)
    result = project(store, messages(events, first_offset=len(events)))
    assert result.applied == 7
    assert figures(store) == before


def test_a_turn_of_a_session_never_started_here_counts_under_the_unknown_fleet(store):
    late = EventFactory()
    project(store, messages([late.completed(5, 3, "mid-log", speaker="agent")]))
    assert figures(store, UNKNOWN_FLEET).talk_time == {"agent": (1, 0.9)}
    assert figures(store, UNKNOWN_FLEET).started_sessions == 0


def test_undecodable_records_are_refused_and_offsets_still_move(store):
    a = EventFactory()
    batch = messages([a.started()]) + [SourceMessage("t.transcript", 0, 1, b"{not json")]
    refused = []
    with store.engine.begin() as conn:
        result = store.offsets.apply_tracked(conn, GROUP, batch, AnalyticsProjection(store).write, on_rejected=lambda m, r: refused.append((m.offset, r)))
        offsets = store.stored_offsets(conn, GROUP, [("t.transcript", 0)])
    assert result.rejected == 1 and [o for o, _ in refused] == [1]
    assert offsets == {("t.transcript", 0): 2}
    assert figures(store).started_sessions == 1
