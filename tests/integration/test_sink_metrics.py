"""The sink's and the finalizer's latency metrics on each store backend: turn-to-store and
finalization delay observed after the batch commits (clamped at 0 for an agent clock
ahead of the sink's), and the finalizer's unfinalized-session gauges."""

from __future__ import annotations

import datetime as dt

import msgspec
from prometheus_client import REGISTRY

from turnlog.settings import TurnlogSettings
from turnlog.sinks.service import SinkService
from turnlog.sinks.sweep import sweep_once

from tests.support import EventFactory, messages, unfinalize

TURN_TO_STORE = "turnlog_sink_turn_to_store_seconds"
FINALIZATION_DELAY = "turnlog_finalization_delay_seconds"


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def histogram(name: str) -> tuple[float, float, float]:
    """``(count, sum, count in the first bucket)`` of a label-less histogram."""
    return sample(f"{name}_count"), sample(f"{name}_sum"), sample(f"{name}_bucket", {"le": "0.005"})


def at(event, emitted_at: dt.datetime, **changes):
    return msgspec.structs.replace(event, emitted_at=emitted_at, **changes)


def sink(store) -> SinkService:
    settings = TurnlogSettings(database_url=str(store.engine.url.render_as_string(hide_password=False)),
                               topic_prefix="t", encryption="off")
    return SinkService(settings, store)


def test_turn_to_store_is_observed_once_per_completed_turn_after_the_commit(store):
    now = dt.datetime.now(dt.UTC)
    f = EventFactory()
    ago = now - dt.timedelta(seconds=30)
    batch = messages([
        at(f.started(), ago),
        at(f.partial(1, 0, "good"), ago),  # a partial turn is not a stored turn
        at(f.completed(2, 0, "good morning"), ago),
        at(f.completed(3, 1, "how can I help"), ago),
        at(f.completed(4, 2, "from the future"), now + dt.timedelta(hours=1)),  # the agent's clock runs ahead
    ])
    count, total, first_bucket = histogram(TURN_TO_STORE)
    service = sink(store)
    assert service.apply(batch).applied == 5
    new_count, new_total, new_first_bucket = histogram(TURN_TO_STORE)
    assert new_count - count == 3
    assert new_first_bucket - first_bucket == 1  # the future turn: clamped at 0
    assert 60 <= new_total - total < 60 + 60  # two turns 30 s old, plus however long the test took
    # Delivered again (below the stored offsets): nothing is stored, nothing observed.
    assert service.apply(batch).stale == 5
    assert histogram(TURN_TO_STORE)[0] == new_count


def test_finalization_delay_is_observed_by_the_sink_and_by_the_sweep(store):
    now = dt.datetime.now(dt.UTC)
    f, g = EventFactory(), EventFactory()
    ended_ago = now - dt.timedelta(seconds=20)
    count, total, _ = histogram(FINALIZATION_DELAY)
    service = sink(store)
    batch = [at(f.started(), now), at(f.completed(1, 0, "hi"), now),
             at(f.ended(2, last_turn=0), now, ended_at=ended_ago)]
    assert service.apply(messages(batch)).finalized == (f.session_id,)
    count_after_sink, total_after_sink, _ = histogram(FINALIZATION_DELAY)
    assert count_after_sink - count == 1
    assert 20 <= total_after_sink - total < 20 + 60

    # A session a sink stored without finalizing: the sweep finalizes it and observes it too.
    batch = [at(g.started(), now), at(g.completed(1, 0, "hi"), now),
             at(g.ended(2, last_turn=0), now, ended_at=now - dt.timedelta(seconds=40))]
    service.apply(messages(batch, first_offset=10))
    unfinalize(store, g.session_id)
    count_before_sweep, total_before_sweep, _ = histogram(FINALIZATION_DELAY)
    assert sweep_once(store) == [g.session_id]
    new_count, new_total, _ = histogram(FINALIZATION_DELAY)
    assert new_count - count_before_sweep == 1
    assert 40 <= new_total - total_before_sweep < 40 + 60


def test_the_sweep_reports_the_ended_sessions_left_unfinalized(store):
    now = dt.datetime.now(dt.UTC)
    service = sink(store)
    assert sweep_once(store) == []
    assert sample("turnlog_finalizer_sessions_unfinalized") == 0
    assert sample("turnlog_finalizer_unfinalized_oldest_seconds") == 0
    # Two sessions ended but incomplete (seq 1 never arrives): not finalizable, reported.
    offset = 0
    for seconds_ago in (100, 10):
        f = EventFactory()
        batch = [at(f.started(), now), at(f.ended(2, last_turn=0), now,
                                          ended_at=now - dt.timedelta(seconds=seconds_ago))]
        service.apply(messages(batch, first_offset=offset))
        offset += 2
    assert sweep_once(store) == []
    assert sample("turnlog_finalizer_sessions_unfinalized") == 2
    assert 100 <= sample("turnlog_finalizer_unfinalized_oldest_seconds") < 100 + 60
