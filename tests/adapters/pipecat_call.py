"""A voice call through a real Pipecat pipeline, for the adapter tests:
STT -> user aggregator -> LLM -> TTS -> output transport -> assistant aggregator.

:func:`voice_pair` builds the aggregator pair as a voice bot does: the user
aggregator runs the VAD (:class:`~tests.adapters.pipecat_services.ScriptedVAD`)
and Pipecat's default start strategies (VAD, transcription) with a speech
timeout stop strategy. :func:`says` is a user turn as audio the input
transport received. :class:`Call` runs the pipeline in a ``PipelineWorker``
with the :class:`TurnlogObserver` attached and waits for what the script needs
by polling typed state with a deadline, never by sleeping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from pipecat.frames.frames import EndFrame, Frame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.turns.user_mute import BaseUserMuteStrategy
from pipecat.turns.user_stop import SpeechTimeoutUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.workers.runner import WorkerRunner

from turnlog.adapters.pipecat import TurnlogObserver

from tests.adapters.pipecat_services import ScriptedVAD, silence, speech

STEP_TIMEOUT = 60.0
#: The pause after which the user's turn ends: the VAD's stop (0.2 s) and the speech timeout.
USER_SPEECH_TIMEOUT = 0.3


def voice_pair(context: LLMContext, mute: Sequence[BaseUserMuteStrategy] = ()) -> LLMContextAggregatorPair:
    """The aggregator pair of a voice bot: the user aggregator hears the audio through
    :class:`ScriptedVAD`, starts the user's turn on the VAD or a transcript (Pipecat's
    defaults, which interrupt the bot) and ends it ``USER_SPEECH_TIMEOUT`` seconds after
    the VAD heard them stop; ``mute``: its user mute strategies."""
    params = LLMUserAggregatorParams(
        vad_analyzer=ScriptedVAD(),
        user_turn_strategies=UserTurnStrategies(
            stop=[SpeechTimeoutUserTurnStopStrategy(user_speech_timeout=USER_SPEECH_TIMEOUT)]
        ),
        user_mute_strategies=list(mute),
    )
    return LLMContextAggregatorPair(context, user_params=params)


def says(*finals: str, interim: str | None = None, pause: float = 0.5) -> list[Frame]:
    """One user utterance as audio: the words the STT hears (an interim hypothesis, then
    each final segment), then ``pause`` seconds of silence."""
    frames: list[Frame] = [speech(interim, final=False)] if interim is not None else []
    frames += [speech(text) for text in finals]
    return [*frames, silence(pause)]


class Call:
    """``pipeline`` run by a ``PipelineWorker`` (and ``WorkerRunner``) with ``observer``
    attached to it and to ``aggregators``, as a bot's code does.

    ``worker_options`` go to the ``PipelineWorker`` (e.g. its ``conversation_id``).
    ``async with Call(...) as call:`` starts it and waits for ``on_pipeline_started``;
    :meth:`send` queues frames at the pipeline's start (the input transport's place);
    :meth:`until` polls a probe with a deadline; :meth:`end` queues an ``EndFrame``
    (or the frame given) and waits for the worker to finish.
    """

    def __init__(self, pipeline: Pipeline, observer: TurnlogObserver, aggregators: LLMContextAggregatorPair,
                 params: PipelineParams | None = None, **worker_options: Any) -> None:
        self.worker = PipelineWorker(pipeline, params=params or PipelineParams(), cancel_on_idle_timeout=False,
                                     **worker_options)
        observer.attach(self.worker, aggregators)
        self._started = asyncio.Event()
        self._run: asyncio.Task[None] | None = None

        @self.worker.event_handler("on_pipeline_started")
        async def on_started(worker: PipelineWorker, frame: Frame) -> None:
            self._started.set()

    async def __aenter__(self) -> Call:
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(self.worker)
        self._run = asyncio.get_running_loop().create_task(runner.run())
        await asyncio.wait_for(self._started.wait(), STEP_TIMEOUT)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        assert self._run is not None
        if not self._run.done():
            await self.worker.cancel()
        await asyncio.wait_for(self._run, STEP_TIMEOUT)

    async def send(self, *frames: Frame) -> None:
        """Queue ``frames`` (flattening lists) at the start of the pipeline."""
        await self.worker.queue_frames(list(frames))

    async def until(self, probe: Callable[[], bool], what: str, timeout: float = STEP_TIMEOUT) -> None:
        """Poll ``probe`` every 10 ms until it is true; TimeoutError naming ``what`` after ``timeout`` s."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not probe():
            if asyncio.get_running_loop().time() >= deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            await asyncio.sleep(0.01)

    async def end(self, frame: Frame | None = None) -> None:
        """Queue ``frame`` (default an ``EndFrame``) and wait until the worker has finished."""
        assert self._run is not None
        await self.worker.queue_frame(frame if frame is not None else EndFrame())
        await asyncio.wait_for(asyncio.shield(self._run), STEP_TIMEOUT)
