"""A Pipecat agent for the adapter's crash test, run as its own process:
``python -m tests.adapters.pipecat_agent SESSION``.

Settings come from the environment (``TURNLOG_*``); progress goes to stdout as
JSON lines, flushed (Pipecat logs to stderr). The agent opens the session with
:meth:`TurnlogObserver.open` (resumed if turnlog has it), builds its
``LLMContext`` from the stored turns as a user would, and prints
``{"resumed": bool, "epoch": int, "context": [...messages]}``. Then it runs a
real ``PipelineWorker`` over the real aggregator pair (``ExternalUserTurnStrategies``),
fed with synthetic STT, LLM and usage-metrics frames:

- a new session: a user turn, an assistant reply (with token usage), a user
  turn, then an assistant reply cut off mid-sentence (no end); while the bot
  speaks the user says something Pipecat's mute filter drops
  (``AlwaysUserMuteStrategy``), then, unmuted, starts a turn. Once all of it
  is recorded, spooled and acknowledged by the broker it prints
  ``{"ready": true, "open_turns": [...]}`` and waits to be SIGKILLed.
- a resumed session: one more user turn and assistant reply, then an
  ``EndFrame``: the session ends ("completed") and the process exits 0.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Sequence

from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    EndFrame,
    Frame,
    InterimTranscriptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    MetricsFrame,
    TranscriptionFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.metrics.metrics import LLMTokenUsage, LLMUsageMetricsData
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.turns.user_mute import AlwaysUserMuteStrategy, BaseUserMuteStrategy
from pipecat.turns.user_turn_strategies import ExternalUserTurnStrategies
from pipecat.workers.runner import WorkerRunner

from turnlog.adapters.pipecat import TurnlogObserver
from turnlog.settings import TurnlogSettings

from tests.adapters.stored import FLEET
from tests.support import recorder_for

SYSTEM = {"role": "system", "content": "You are a delivery assistant."}
STEP_TIMEOUT = 60.0


def say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def user_says(*finals: str, interim: str | None = None) -> list[Frame]:
    """One user turn as an external-turn STT emits it: started, transcripts, stopped."""
    frames: list[Frame] = [UserStartedSpeakingFrame()]
    if interim is not None:
        frames.append(InterimTranscriptionFrame(interim, "caller", "2026-01-01T00:00:00Z"))
    frames += [TranscriptionFrame(text, "caller", "2026-01-01T00:00:00Z") for text in finals]
    return frames + [UserStoppedSpeakingFrame()]


def usage(prompt: int, completion: int) -> MetricsFrame:
    """An LLM service's token usage report."""
    tokens = LLMTokenUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    return MetricsFrame(data=[LLMUsageMetricsData(processor="fake-llm", model="fake", value=tokens)])


def llm_says(*chunks: str, tokens: tuple[int, int] | None = None, finished: bool = True) -> list[Frame]:
    """One LLM response: start, text chunks, usage, end (none if not ``finished``)."""
    frames: list[Frame] = [LLMFullResponseStartFrame(), *(LLMTextFrame(chunk) for chunk in chunks)]
    if tokens is not None:
        frames.append(usage(*tokens))
    return frames + ([LLMFullResponseEndFrame()] if finished else [])


def aggregator_pair(context: LLMContext, mute: Sequence[BaseUserMuteStrategy] = ()) -> LLMContextAggregatorPair:
    """The pair with ``ExternalUserTurnStrategies`` (the default end-of-turn analyzer never ends a
    turn on synthetic frames) and the user mute strategies ``mute``."""
    params = LLMUserAggregatorParams(user_turn_strategies=ExternalUserTurnStrategies(), user_mute_strategies=list(mute))
    return LLMContextAggregatorPair(context, user_params=params)


async def until(probe: Callable[[], bool], what: str, timeout: float = STEP_TIMEOUT) -> None:
    """Poll ``probe`` every 20 ms until it is true; TimeoutError after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not probe():
        if asyncio.get_running_loop().time() >= deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def main(session_id: str) -> None:
    async with recorder_for(TurnlogSettings()) as recorder:
        observer = await TurnlogObserver.open(recorder, session_id, fleet=FLEET, agent_id="pipecat-agent")
        context = LLMContext([SYSTEM, *observer.messages])
        say(resumed=observer.resumed, epoch=observer.session.epoch, context=context.messages)
        aggregators = aggregator_pair(context, mute=[AlwaysUserMuteStrategy()])
        worker = PipelineWorker(Pipeline(list(aggregators)), cancel_on_idle_timeout=False)
        observer.attach(worker, aggregators)
        started = asyncio.Event()

        @worker.event_handler("on_pipeline_started")
        async def on_started(worker: PipelineWorker, frame: Frame) -> None:
            started.set()

        session = observer.session
        first = session.next_turn_index

        async def step(frames: Sequence[Frame], turns: int, open_turns: tuple[int, ...] = ()) -> None:
            """Queue ``frames``; wait until turns ``first .. first + turns - 1`` are recorded."""
            await worker.queue_frames(list(frames))
            await worker.flush_pipeline()
            await until(
                lambda: session.next_turn_index >= first + turns and session.open_turns == open_turns,
                f"{turns} turns recorded, {open_turns} open",
            )
            await observer.drained()

        async def converse() -> None:
            await asyncio.wait_for(started.wait(), STEP_TIMEOUT)
            if not observer.resumed:
                await step(user_says("I'd like to change", "my delivery address.", interim="I'd like"), 1)
                await step(llm_says("Of course.", " What is the new address?", tokens=(20, 8)), 2)
                await step(user_says("12 Elm Street, Springfield."), 3)
                await step(llm_says("Thanks, I'm updating", " your order to 12 Elm", finished=False), 4, open_turns=(first + 3,))
                # While the bot speaks the user is muted: Pipecat drops what they say. Then the
                # bot stops, and the user's next words open a turn of their own.
                # Each group is flushed through before the next: Pipecat runs system frames (the
                # bot's speaking state) ahead of data frames (transcripts) queued with them.
                for group in ([BotStartedSpeakingFrame()], user_says("um, hold on", interim="um"), [BotStoppedSpeakingFrame()]):
                    await worker.queue_frames(group)
                    assert await worker.flush_pipeline(STEP_TIMEOUT), "not flushed"
                heard = InterimTranscriptionFrame("Hello?", "caller", "2026-01-01T00:00:00Z")
                await step([heard], 5, open_turns=(first + 3, first + 4))
                await session.flush_partial()
                assert await session.wait_acknowledged(STEP_TIMEOUT), "not acknowledged"
                say(ready=True, open_turns=list(session.open_turns))
                await asyncio.Event().wait()  # until SIGKILL
            await step(user_says("Did it go through?"), 1)
            await step(llm_says("Yes, it ships to", " 12 Elm Street.", tokens=(35, 9)), 2)
            await worker.queue_frame(EndFrame())

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        await asyncio.gather(runner.run(), converse())
        say(ended=session.closed, errors=[str(e) for e in observer.errors])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
