"""A batch the sequencer did not finish is never acked: the worker stops uncommitted instead
(``stream_processors/sequencer.py``, ``_whole_or_stop``)."""

from __future__ import annotations

import asyncio

import pytest

from turnlog.settings import TurnlogSettings
from turnlog.stream_processors import sequencer as sequencer_module


class StoppedUncommitted(Exception):
    """Raised in place of the worker's ``os._exit``."""


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    seen: list[BaseException] = []

    def stop(_settings: TurnlogSettings, error: BaseException) -> None:
        seen.append(error)
        raise StoppedUncommitted

    monkeypatch.setattr(sequencer_module, "_stop_uncommitted", stop)
    return seen


def test_any_failure_of_a_batch_stops_the_worker(stops: list[BaseException]) -> None:
    async def failing() -> None:
        raise KeyError("a bug")

    with pytest.raises(StoppedUncommitted):
        asyncio.run(sequencer_module._whole_or_stop(TurnlogSettings(), failing()))
    assert [type(e) for e in stops] == [KeyError]


def test_a_batch_cancelled_midway_is_finished_before_the_cancellation_goes_on(stops: list[BaseException]) -> None:
    finished: list[str] = []

    async def scenario() -> None:
        started = asyncio.Event()

        async def slow_batch() -> None:
            started.set()
            await asyncio.sleep(0.05)  # the batch's transaction, committing
            finished.append("committed")

        agent = asyncio.ensure_future(sequencer_module._whole_or_stop(TurnlogSettings(), slow_batch()))
        await started.wait()
        agent.cancel()  # Faust stopping its agent
        with pytest.raises(asyncio.CancelledError):
            await agent

    asyncio.run(scenario())
    assert finished == ["committed"]
    assert stops == []


def test_a_batch_that_fails_after_its_agent_was_cancelled_stops_the_worker(stops: list[BaseException]) -> None:
    async def scenario() -> None:
        started = asyncio.Event()

        async def failing_batch() -> None:
            started.set()
            await asyncio.sleep(0.05)
            raise ConnectionError("the broker went away")

        agent = asyncio.ensure_future(sequencer_module._whole_or_stop(TurnlogSettings(), failing_batch()))
        await started.wait()
        agent.cancel()
        with pytest.raises(StoppedUncommitted):
            await agent

    asyncio.run(scenario())
    assert [type(e) for e in stops] == [ConnectionError]
