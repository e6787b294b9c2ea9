"""Stand-ins for Pipecat services, built on Pipecat's own service classes, for the adapter tests.

- :class:`ScriptedLLM`: an ``LLMService`` that answers each ``LLMContextFrame``
  with the next scripted reply, streamed as ``LLMTextFrame`` chunks between
  ``LLMFullResponseStartFrame`` and ``LLMFullResponseEndFrame``, with its token
  usage reported through ``start_llm_usage_metrics`` (as the OpenAI service does).
- :class:`SilentTTS`: a ``TTSService`` that "speaks" each sentence as one short
  audio frame; Pipecat's ``TTSService`` itself aggregates the LLM text into
  sentences and pushes the ``TTSTextFrame`` words the assistant aggregator records.
- :class:`RealtimeLLM`: an ``LLMService`` that announces itself as a realtime
  (speech-to-speech) service, like ``OpenAIRealtimeLLMService``, driven by the
  script frames :class:`HeardDelta`, :class:`HeardFinal` and :class:`Responds`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from pipecat.frames.frames import (
    DataFrame,
    Frame,
    InterimTranscriptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMServiceMetadataFrame,
    LLMTextFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
)
from pipecat.metrics.metrics import LLMTokenUsage
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import LLMService
from pipecat.services.openai.realtime.events import ConversationItemInputAudioTranscriptionDelta
from pipecat.services.tts_service import TTSService


@dataclass(frozen=True)
class Reply:
    """One scripted LLM answer: its streamed chunks and its usage (``prompt_tokens`` net of a
    cache read of ``cached`` tokens, as Anthropic reports it; ``total_tokens`` gross)."""

    chunks: Sequence[str]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: int = 0

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    def usage(self) -> LLMTokenUsage:
        total = self.prompt_tokens + self.cached + self.completion_tokens
        return LLMTokenUsage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                             total_tokens=total, cache_read_input_tokens=self.cached or None)


class ScriptedLLM(LLMService):
    """Answers each ``LLMContextFrame`` with the next of ``replies``; records the contexts it was given."""

    def __init__(self, replies: Sequence[Reply], **kwargs) -> None:
        super().__init__(**kwargs)
        self.replies = list(replies)
        #: The messages of each context it answered (copies).
        self.contexts: list[list[dict]] = []

    def can_generate_metrics(self) -> bool:
        return True

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        self.contexts.append([dict(m) for m in frame.context.messages])
        reply = self.replies.pop(0)
        await self.push_frame(LLMFullResponseStartFrame())
        for chunk in reply.chunks:
            await self.push_frame(LLMTextFrame(chunk))
        await self.start_llm_usage_metrics(reply.usage())
        await self.push_frame(LLMFullResponseEndFrame())


class SilentTTS(TTSService):
    """A TTS whose audio is silence: one 10 ms frame per sentence."""

    def __init__(self, **kwargs) -> None:
        super().__init__(sample_rate=16000, **kwargs)

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        yield TTSAudioRawFrame(audio=b"\x00" * 320, sample_rate=16000, num_channels=1, context_id=context_id)


@dataclass
class HeardDelta(DataFrame):
    """Script: the realtime service transcribed ``delta`` more of item ``item_id``."""

    item_id: str = ""
    delta: str = ""


@dataclass
class HeardFinal(DataFrame):
    """Script: the realtime service completed the input transcription ``transcript``."""

    transcript: str = ""


@dataclass
class Responds(DataFrame):
    """Script: the realtime service answers with ``chunks`` (start, text, end)."""

    chunks: tuple[str, ...] = ()
    finished: bool = True


class RealtimeLLM(LLMService):
    """A speech-to-speech service: it announces ``is_realtime_service`` as OpenAI Realtime does
    (``OpenAIRealtimeLLMService.service_metadata_frame``) and turns the script frames that reach
    it into what OpenAI Realtime pushes: each input-transcription delta as an upstream
    ``InterimTranscriptionFrame`` carrying the event (``_handle_evt_input_audio_transcription_delta``),
    the completed transcript as an upstream ``TranscriptionFrame``, a response downstream."""

    def service_metadata_frame(self) -> LLMServiceMetadataFrame:
        return LLMServiceMetadataFrame(service_name=self.name, is_realtime_service=True)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, HeardDelta):
            event = ConversationItemInputAudioTranscriptionDelta(
                type="conversation.item.input_audio_transcription.delta", event_id=f"event-{frame.id}",
                item_id=frame.item_id, content_index=0, delta=frame.delta,
            )
            await self.push_frame(InterimTranscriptionFrame(frame.delta, "", "", result=event), FrameDirection.UPSTREAM)
        elif isinstance(frame, HeardFinal):
            await self.push_frame(TranscriptionFrame(frame.transcript, "", ""), FrameDirection.UPSTREAM)
        elif isinstance(frame, Responds):
            await self.push_frame(LLMFullResponseStartFrame())
            for chunk in frame.chunks:
                await self.push_frame(LLMTextFrame(chunk))
            if frame.finished:
                await self.push_frame(LLMFullResponseEndFrame())
        elif not isinstance(frame, LLMContextFrame):  # a realtime service keeps its own context
            await self.push_frame(frame, direction)
