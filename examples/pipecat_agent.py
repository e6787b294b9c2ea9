"""A Pipecat agent whose conversation survives a crash: turnlog records every turn as it happens,
and a restarted agent continues the same session with its LLM context rebuilt from turnlog.

The lines marked ``# turnlog`` are all the code turnlog needs (8 lines); the rest is an
ordinary pipecat-ai 1.x bot.

Run it (turnlog's services up, ``TURNLOG_*`` set: broker, and the store or the API for resume)::

    python examples/pipecat_agent.py call-42 --crash     # a scripted caller and an echo "LLM" (no network, no API
                                                         # keys); SIGKILLs itself after the caller's second turn
    python examples/pipecat_agent.py call-42             # resumes call-42 with the LLM context rebuilt from turnlog,
                                                         # and ends it when the caller hangs up

For a real bot, put your transport and services in ``your_processors()`` and call
``run_agent(session_id, your_processors())`` from your transport's connection handler.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    LLMContextFrame,
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
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.turns.user_turn_strategies import ExternalUserTurnStrategies
from pipecat.workers.runner import WorkerRunner

from turnlog import SessionRecorder, TurnlogSettings  # turnlog
from turnlog.adapters.pipecat import TurnlogObserver  # turnlog
from turnlog.resume_barrier import resume_source_for  # turnlog: the API with TURNLOG_API_URL, else the store

SYSTEM = {"role": "system", "content": "You are a friendly voice assistant. Keep answers short."}


async def run_agent(session_id: str, processors: tuple[list[FrameProcessor], list[FrameProcessor]], script=None) -> None:
    """Run one conversation. ``processors``: what goes before the user aggregator
    (transport input, STT) and between the aggregators (LLM, TTS, transport output)."""
    before, between = processors
    settings = TurnlogSettings()  # turnlog
    async with SessionRecorder(settings, resume_source=resume_source_for(settings)) as recorder:  # turnlog
        observer = await TurnlogObserver.open(recorder, session_id, fleet="support", agent_id="pipecat-bot")  # turnlog
        context = LLMContext([SYSTEM, *observer.messages])  # turnlog: the stored conversation after a crash
        aggregators = LLMContextAggregatorPair(
            context, user_params=LLMUserAggregatorParams(user_turn_strategies=ExternalUserTurnStrategies())
        )
        pipeline = Pipeline([*before, aggregators.user(), *between, aggregators.assistant()])
        worker = PipelineWorker(pipeline, params=PipelineParams(enable_metrics=True, enable_usage_metrics=True))
        observer.attach(worker, aggregators)  # turnlog
        print(f"session {session_id}: {'resumed' if observer.resumed else 'new'}, context of {len(context.messages)} messages")
        await asyncio.gather(WorkerRunner().run(worker), *([script(worker)] if script else []))


def your_processors() -> tuple[list[FrameProcessor], list[FrameProcessor]]:
    """Your transport and services (they need their own extras and API keys), for example::

        stt = DeepgramSTTService(api_key=os.environ["DEEPGRAM_API_KEY"])
        llm = OpenAILLMService(api_key=os.environ["OPENAI_API_KEY"], model="gpt-4o-mini")
        tts = CartesiaTTSService(api_key=os.environ["CARTESIA_API_KEY"], voice_id="...")
        return [transport.input(), stt], [llm, tts, transport.output()]
    """
    raise NotImplementedError("put your transport and STT/LLM/TTS services here")


# -- the stand-ins that make this file runnable without network or API keys ------------------------
class EchoLLM(FrameProcessor):
    """Stands in for an LLM service: answers each context with a streamed reply and a usage report."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        messages = frame.context.messages
        reply = f"You said: {messages[-1]['content']} ({len(messages)} messages in my context)"
        await self.push_frame(LLMFullResponseStartFrame())
        for i, word in enumerate(reply.split(" ")):  # streamed as tokens, spaces included
            await self.push_frame(LLMTextFrame(word if i == 0 else f" {word}"))
        prompt_tokens, completion_tokens = 10 * len(messages), len(reply.split())
        usage = LLMTokenUsage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                              total_tokens=prompt_tokens + completion_tokens)
        await self.push_frame(MetricsFrame(data=[LLMUsageMetricsData(processor="echo", value=usage)]))
        await self.push_frame(LLMFullResponseEndFrame())


def scripted_caller(crash: bool):
    """Stands in for a transport and an STT with turn detection: says three things, then hangs up
    (or, with ``crash``, the process is SIGKILLed after the second answer: no handler runs)."""

    async def caller(worker: PipelineWorker) -> None:
        await asyncio.sleep(1.0)
        for turn, text in enumerate(("Hello, is this the support line?", "My parcel has not arrived.", "Thanks, bye.")):
            await worker.queue_frames(
                [UserStartedSpeakingFrame(), TranscriptionFrame(text, "caller", ""), UserStoppedSpeakingFrame()]
            )
            await asyncio.sleep(1.5)
            if crash and turn == 1:
                os.kill(os.getpid(), signal.SIGKILL)
        await worker.queue_frame(EndFrame())

    return caller


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("session_id")
    parser.add_argument("--crash", action="store_true", help="SIGKILL this process after the caller's second turn")
    args = parser.parse_args()
    asyncio.run(run_agent(args.session_id, ([], [EchoLLM()]), script=scripted_caller(args.crash)))


if __name__ == "__main__":
    main()
