"""A Pipecat agent with a realtime (speech-to-speech) service, for the adapter's crash test:
``python -m tests.adapters.pipecat_realtime_agent SESSION``.

Progress goes to stdout as JSON lines. It opens the session with
:meth:`TurnlogObserver.open`, prints ``{"resumed": bool, "context": [...]}``
(its ``LLMContext`` rebuilt from turnlog), and runs a real ``PipelineWorker``
over ``[user aggregator, RealtimeLLM, assistant aggregator]``:

- a new session: a user turn (started by the service's server VAD, as OpenAI
  Realtime does) whose transcript comes after the response started, the
  response, then a user turn transcribed as OpenAI Realtime deltas. Once the deltas are recorded, spooled and acknowledged it prints
  ``{"ready": true, "open_turns": [...]}`` and waits to be SIGKILLed.
- a resumed session: an ``EndFrame`` (the session ends "completed"), then
  ``{"ended": bool}``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    LLMFullResponseEndFrame,
    LLMTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.workers.runner import WorkerRunner

from turnlog.adapters.pipecat import TurnlogObserver
from turnlog.settings import TurnlogSettings

from tests.adapters.pipecat_agent import STEP_TIMEOUT, SYSTEM, aggregator_pair, say, until
from tests.adapters.pipecat_services import HeardDelta, HeardFinal, RealtimeLLM, Responds, SpeechStarted, SpeechStopped
from tests.adapters.stored import FLEET
from tests.support import recorder_for


async def main(session_id: str) -> None:
    async with recorder_for(TurnlogSettings()) as recorder:
        observer = await TurnlogObserver.open(recorder, session_id, fleet=FLEET, agent_id="pipecat-realtime")
        context = LLMContext([SYSTEM, *observer.messages])
        say(resumed=observer.resumed, context=context.messages)
        aggregators = aggregator_pair(context)
        user, assistant = aggregators
        worker = PipelineWorker(Pipeline([user, RealtimeLLM(), assistant]), cancel_on_idle_timeout=False)
        observer.attach(worker, aggregators)
        started = asyncio.Event()

        @worker.event_handler("on_pipeline_started")
        async def on_started(worker: PipelineWorker, frame: Frame) -> None:
            started.set()

        session = observer.session

        async def in_order(*groups: Sequence[Frame]) -> None:
            """Each group flushed through before the next (system frames overtake data frames)."""
            for group in groups:
                await worker.queue_frames(list(group))
                assert await worker.flush_pipeline(STEP_TIMEOUT), "not flushed"

        async def converse() -> None:
            await asyncio.wait_for(started.wait(), STEP_TIMEOUT)
            if not observer.resumed:
                await in_order(
                    [SpeechStarted()], [SpeechStopped()],
                    [Responds(("It shipped",), finished=False)], [HeardFinal("Where is my order?")],
                    [LLMTextFrame(" yesterday."), LLMFullResponseEndFrame()],
                )
                await until(lambda: session.next_turn_index >= 2 and not session.open_turns, "the first exchange")
                await in_order(
                    [SpeechStarted()],
                    [HeardDelta(item_id="item-2", delta="Thanks,"), HeardDelta(item_id="item-2", delta=" that is"),
                     HeardDelta(item_id="item-2", delta=" all.")],
                )
                await until(lambda: session.open_turns == (2,), "the deltas' turn open")
                await observer.drained()
                await session.flush_partial()
                assert await session.wait_acknowledged(STEP_TIMEOUT), "not acknowledged"
                say(ready=True, open_turns=list(session.open_turns))
                await asyncio.Event().wait()  # until SIGKILL
            await worker.queue_frame(EndFrame())

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        await asyncio.gather(runner.run(), converse())
        say(ended=session.closed)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
