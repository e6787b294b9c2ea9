"""The override of Faust's recovery completion (``stream_processors/recovery.py``).

The ordering test drives the real ``Recovery`` methods of a real (unstarted)
``faust.App``; only the broker I/O is replaced: ``perform_seek`` stands in
for the fetcher, which runs during that await and delivers a record of every
stream partition that is not paused into the agent's input queue (a
``clear_on_resume`` queue, as every Faust agent's is). Upstream's order loses
those records; ours must not fetch any before the seek and keep everything
fetched after it.
"""

from __future__ import annotations

import hashlib
import inspect
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import faust
import pytest
from faust.tables import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP

from turnlog.kafka import BrokerError, BrokerUnavailableError, UnknownTopicError
from turnlog.stream_processors import recovery as recovery_module
from turnlog.stream_processors.recovery import FAUST_VERSION, OrderedRecovery, OrderedTableManager

ROOT = Path(__file__).resolve().parents[2]

#: SHA-256 of the upstream sources the override replaces, as of FAUST_VERSION.
UPSTREAM_SOURCES = {
    "on_recovery_completed": "6ef567acf072e46da3fccbccc6d662371f634f622c3d510972d5df81f70ae3ac",
    "_resume_streams": "d986a6710c1aca98f08c4c723fb3eadc5bf24576ad4eb9da3dd3eecedda2f24e",
}
EVENTS = TP("events", 0)
CHANGELOG = TP("app-state-changelog", 0)


def test_faust_is_pinned_to_the_version_the_override_was_written_against() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = [d for d in pyproject["project"]["dependencies"] if d.startswith("faust-streaming")]
    assert pins == [f"faust-streaming=={FAUST_VERSION}"]
    assert faust.__version__ == FAUST_VERSION


@pytest.mark.parametrize("method", sorted(UPSTREAM_SOURCES))
def test_the_upstream_methods_replaced_are_unchanged(method: str) -> None:
    source = inspect.getsource(getattr(Recovery, method))
    assert hashlib.sha256(source.encode()).hexdigest() == UPSTREAM_SOURCES[method], (
        f"faust's Recovery.{method} changed: re-check stream_processors/recovery.py against it"
    )


def test_the_app_uses_the_ordered_recovery() -> None:
    from turnlog.settings import load_settings
    from turnlog.stream_processors.app import make_app

    app = make_app(load_settings(), "recovery-override-check")
    assert isinstance(app.tables, OrderedTableManager)
    assert isinstance(app.tables.recovery, OrderedRecovery)
    assert TableManager.recovery.fget is not OrderedTableManager.recovery.fget


class _FetchDuringSeek:
    """Stands in for the broker side of the consumer: while ``perform_seek`` is
    awaited, the fetcher delivers one record per unpaused stream partition."""

    def __init__(self, app: faust.App, queue: Any) -> None:
        self.app = app
        self.queue = queue
        self.calls: list[str] = []

    async def perform_seek(self) -> None:
        consumer = self.app.consumer
        paused = EVENTS in consumer._paused_partitions
        self.calls.append("seek(paused)" if paused else "seek(resumed)")
        if not paused:  # the fetcher runs during the await and reads past the old position
            self.queue.put_nowait(("fetched during seek", EVENTS))

    def resume_partitions(self, tps: Any) -> None:
        self.calls.append("resume_partitions")
        type(self.app.consumer).resume_partitions(self.app.consumer, tps)


async def _complete_recovery(recovery_class: type[Recovery]) -> tuple[list[str], list[Any]]:
    app = faust.App("recovery-order", broker="kafka://127.0.0.1:1", store="memory://")
    consumer = app.consumer
    queue = app.FlowControlQueue(maxsize=100, clear_on_resume=True)  # an agent's input queue
    fake = _FetchDuringSeek(app, queue)
    consumer.assignment = lambda: {EVENTS, CHANGELOG}  # type: ignore[method-assign]
    consumer.perform_seek = fake.perform_seek  # type: ignore[method-assign]
    consumer.resume_partitions = fake.resume_partitions  # type: ignore[method-assign]
    consumer.pause_partitions({EVENTS, CHANGELOG})  # as at the rebalance
    consumer.resume_partitions({CHANGELOG})  # the restore reads the changelog...
    app.flow_control.resume()  # ...with the flow running
    fake.calls.clear()

    async def no_fetcher() -> None:
        return None

    app._fetcher.maybe_start = no_fetcher  # type: ignore[method-assign]
    recovery = recovery_class(app, app.tables, beacon=app.beacon)
    await recovery.on_recovery_completed(generation_id=app.consumer_generation_id)
    queue.put_nowait(("fetched after completion", EVENTS))  # the fetcher's next record
    delivered = []
    while not queue.empty():
        delivered.append(queue.get_nowait()[0])
    assert EVENTS not in consumer._paused_partitions
    return fake.calls, delivered


async def test_upstream_order_drops_what_the_fetcher_delivered_during_the_seek() -> None:
    calls, delivered = await _complete_recovery(Recovery)
    assert calls[:2] == ["resume_partitions", "seek(resumed)"]
    # The record delivered during the seek was cleared by flow_control.resume(), never acked.
    assert delivered == ["fetched after completion"]


async def test_ordered_recovery_seeks_paused_partitions_and_drops_nothing() -> None:
    calls, delivered = await _complete_recovery(OrderedRecovery)
    assert calls == ["seek(paused)", "resume_partitions"]
    assert delivered == ["fetched after completion"]


class _FlakyRecordEnds:
    """``record_ends`` of a cluster in failover: ``failures`` (errors raised in turn), then an answer."""

    def __init__(self, failures: list[BrokerError]) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, topic: str, partitions: Any) -> dict[int, int]:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return {p: 7 for p in partitions}


def _recovery_with(record_ends: _FlakyRecordEnds) -> OrderedRecovery:
    app = faust.App("recovery-ends", broker="kafka://127.0.0.1:1", store="memory://")
    app.record_ends = record_ends  # type: ignore[attr-defined]
    return OrderedRecovery(app, app.tables, beacon=app.beacon)


async def test_the_restore_end_is_looked_up_again_while_the_broker_fails_over(monkeypatch) -> None:
    monkeypatch.setattr(recovery_module, "RESTORE_END_RETRY_SECONDS", 0.01)
    record_ends = _FlakyRecordEnds([
        UnknownTopicError("the partition is not in the client's metadata", retriable=True),
        BrokerUnavailableError("no leader", retriable=True),
    ])
    highwaters: Counter[TP] = Counter()
    await _recovery_with(record_ends)._build_highwaters(None, {CHANGELOG}, highwaters, "active")
    assert record_ends.calls == 3
    assert highwaters == {CHANGELOG: 6}  # the last committed record's offset


async def test_a_restore_end_lookup_that_cannot_succeed_fails_at_once(monkeypatch) -> None:
    monkeypatch.setattr(recovery_module, "RESTORE_END_RETRY_SECONDS", 0.01)
    record_ends = _FlakyRecordEnds([UnknownTopicError("topic gone", retriable=False)])
    with pytest.raises(UnknownTopicError):
        await _recovery_with(record_ends)._build_highwaters(None, {CHANGELOG}, Counter(), "active")
    assert record_ends.calls == 1
