"""Stand-ins for Pipecat services, built on Pipecat's own service classes, for the adapter tests.

- :class:`ScriptedLLM`: an ``LLMService`` that answers each ``LLMContextFrame``
  with the next scripted reply, streamed as ``LLMTextFrame`` chunks between
  ``LLMFullResponseStartFrame`` and ``LLMFullResponseEndFrame``, with its token
  usage reported through ``start_llm_usage_metrics`` (as the OpenAI service does);
  a reply's :class:`FunctionCall` s go through ``LLMService.run_function_calls`` before the
  end frame, as the OpenAI service runs the function calls of a streamed answer.
- :class:`SilentTTS`: a streaming ``TTSService`` that "speaks" each piece of the
  LLM's text as silence as long as its words, between the ``TTSStartedFrame`` and
  ``TTSStoppedFrame`` Pipecat's ``TTSService`` sends for it (as for ``OpenAITTSService``);
  it pushes the ``TTSTextFrame`` words the assistant aggregator records.
- :class:`RealtimeLLM`: an ``LLMService`` that announces itself as a realtime
  (speech-to-speech) service, like ``OpenAIRealtimeLLMService``, driven by the
  script frames :class:`SpeechStarted` / :class:`SpeechStopped` (its server VAD),
  :class:`HeardDelta`, :class:`HeardFinal` and :class:`Responds`.
- :class:`ScriptedSTT`: an ``STTService`` whose ``run_stt`` transcribes each
  :class:`Speech` audio frame (a ``UserAudioRawFrame`` carrying the words it
  stands for) into the ``InterimTranscriptionFrame`` or ``TranscriptionFrame``
  a streaming STT would push, through Pipecat's own audio path (mute, user id).
- :class:`ScriptedVAD`: a ``VADAnalyzer`` for the user aggregator
  (``LLMUserAggregatorParams(vad_analyzer=...)``): voice wherever the audio is
  not silence, so Pipecat's VAD controller and turn strategies decide when the
  user starts and stops speaking (and interrupt the bot).
- :class:`Speaker`: a ``BaseOutputTransport`` whose device plays audio in real
  time; Pipecat's output transport machinery sends the bot-speaking frames and
  releases the TTS words as their audio is played.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from pipecat.audio.vad.vad_analyzer import VADAnalyzer, VADParams
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    DataFrame,
    Frame,
    FunctionCallFromLLM,
    InterimTranscriptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMServiceMetadataFrame,
    LLMTextFrame,
    OutputAudioRawFrame,
    StartFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
    UserAudioRawFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.metrics.metrics import LLMTokenUsage
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import LLMService
from pipecat.services.openai.realtime.events import ConversationItemInputAudioTranscriptionDelta
from pipecat.services.stt_service import STTService
from pipecat.services.tts_service import TextAggregationMode, TTSService
from pipecat.transcriptions.language import Language
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.utils.time import time_now_iso8601

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class FunctionCall:
    """A function call the scripted LLM asks for: the registered function ``name`` with ``arguments``."""

    name: str
    arguments: dict
    call_id: str = ""


@dataclass(frozen=True)
class Reply:
    """One scripted LLM answer: its streamed chunks and its usage (``prompt_tokens`` net of a
    cache read of ``cached`` tokens, as Anthropic reports it; ``total_tokens`` gross)."""

    chunks: Sequence[str]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: int = 0
    calls: Sequence[FunctionCall] = ()

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
        if reply.calls:
            await self.run_function_calls([
                FunctionCallFromLLM(function_name=call.name, tool_call_id=call.call_id or f"call_{uuid.uuid4().hex[:8]}",
                                    arguments=call.arguments, context=frame.context)
                for call in reply.calls
            ])
        await self.push_frame(LLMFullResponseEndFrame())


class SilentTTS(TTSService):
    """A streaming TTS whose audio is silence, ``seconds_per_word`` long per word of each
    piece of text it is given.

    It takes the LLM's text as it streams (``TextAggregationMode.TOKEN``): the sentence mode
    of Pipecat 1.5 to 1.10 (1.14 no longer) splits sentences with NLTK's ``punkt_tab``, which
    Pipecat downloads on first use and the test machines cannot fetch (1.7 to 1.10 need it in
    this mode too, to regroup the streamed text: see docs/adapters/pipecat.md). How many
    ``TTSTextFrame``s a reply's words come in depends on the release."""

    def __init__(self, seconds_per_word: float = 0.0, **kwargs) -> None:
        # What OpenAITTSService (and most HTTP TTS services) give the base class: it opens each
        # reply's audio context with a TTSStartedFrame and closes it with a TTSStoppedFrame once
        # the audio stopped coming, which is what commits the bot's words in Pipecat's context.
        kwargs = {"push_start_frame": True, "push_stop_frames": True, **kwargs}
        super().__init__(sample_rate=SAMPLE_RATE, text_aggregation_mode=TextAggregationMode.TOKEN, **kwargs)
        self.seconds_per_word = seconds_per_word

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        seconds = max(0.01, self.seconds_per_word * len(text.split()))
        audio = b"\x00\x00" * int(SAMPLE_RATE * seconds)
        yield TTSAudioRawFrame(audio=audio, sample_rate=SAMPLE_RATE, num_channels=1, context_id=context_id)


# -- the user's side: audio that stands for words, an STT and a VAD that hear it ------------
@dataclass
class Speech(UserAudioRawFrame):
    """Audio the input transport received: ``heard`` is what the STT makes of it (an
    interim hypothesis unless ``final``); audio with no ``heard`` text is silence."""

    heard: str = ""
    final: bool = True


def speech(heard: str, *, final: bool = True, seconds: float = 0.2, user_id: str = "caller") -> Speech:
    """``seconds`` of voiced audio (a VAD hears it) that the STT transcribes as ``heard``."""
    audio = b"\x00\x10" * int(SAMPLE_RATE * seconds)
    return Speech(audio=audio, sample_rate=SAMPLE_RATE, num_channels=1, user_id=user_id, heard=heard, final=final)


def silence(seconds: float, *, user_id: str = "caller") -> Speech:
    """``seconds`` of silent audio (the VAD hears the user stop)."""
    audio = b"\x00\x00" * int(SAMPLE_RATE * seconds)
    return Speech(audio=audio, sample_rate=SAMPLE_RATE, num_channels=1, user_id=user_id)


class ScriptedSTT(STTService):
    """A streaming STT: ``run_stt`` gets the audio through ``STTService.process_audio_frame``
    (which drops it while the service is muted and keeps the frame's ``user_id``) and yields
    the :class:`Speech` frame's words as an ``InterimTranscriptionFrame`` or a
    ``TranscriptionFrame`` (user id, ISO 8601 timestamp, language), as Pipecat's STT services do."""

    def __init__(self, language: Language = Language.EN, **kwargs) -> None:
        super().__init__(sample_rate=SAMPLE_RATE, **kwargs)
        self.language = language
        #: The transcription frames it pushed, in order.
        self.transcribed: list[Frame] = []
        self._heard: Speech | None = None

    async def process_audio_frame(self, frame, direction: FrameDirection) -> None:  # noqa: ANN001
        self._heard = frame if isinstance(frame, Speech) and frame.heard else None
        await super().process_audio_frame(frame, direction)

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame | None, None]:
        heard, self._heard = self._heard, None
        if heard is None:
            yield None
            return
        kind = TranscriptionFrame if heard.final else InterimTranscriptionFrame
        frame = kind(heard.heard, self._user_id, time_now_iso8601(), self.language)
        self.transcribed.append(frame)
        yield frame


class ScriptedVAD(VADAnalyzer):
    """Voice wherever the audio is not silence (no volume gate): the VAD state machine, its
    ``start_secs`` / ``stop_secs`` and the events it drives are Pipecat's."""

    def __init__(self, *, start_secs: float = 0.1, stop_secs: float = 0.2) -> None:
        super().__init__(params=VADParams(start_secs=start_secs, stop_secs=stop_secs, min_volume=0.0))

    def num_frames_required(self) -> int:
        return int(self.sample_rate * 0.02)

    def voice_confidence(self, buffer: bytes) -> float:
        return 1.0 if any(buffer) else 0.0


# -- the bot's side: an output transport that plays in real time ---------------------------
class Speaker(BaseOutputTransport):
    """An output transport whose device plays each audio chunk in real time.

    ``BaseOutputTransport`` itself sends ``BotStartedSpeakingFrame`` /
    ``BotStoppedSpeakingFrame`` and releases the TTS words as their audio is played;
    this records what it released: :attr:`bot_speaking` and :attr:`spoken` (the
    ``TTSTextFrame`` texts, in order)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(TransportParams(audio_out_enabled=True, audio_out_sample_rate=SAMPLE_RATE), **kwargs)
        self.bot_speaking = False
        self.spoken: list[str] = []

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        await asyncio.sleep(len(frame.audio) / (2 * frame.num_channels * frame.sample_rate))
        return True

    async def push_frame(self, frame: Frame, direction: FrameDirection = FrameDirection.DOWNSTREAM) -> None:
        if direction == FrameDirection.DOWNSTREAM:
            if isinstance(frame, BotStartedSpeakingFrame):
                self.bot_speaking = True
            elif isinstance(frame, BotStoppedSpeakingFrame):
                self.bot_speaking = False
            elif isinstance(frame, TTSTextFrame):
                self.spoken.append(frame.text)
        await super().push_frame(frame, direction)


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
class SpeechStarted(DataFrame):
    """Script: the realtime service's server VAD heard the user start speaking."""


@dataclass
class SpeechStopped(DataFrame):
    """Script: the realtime service's server VAD heard the user stop speaking."""


@dataclass
class Responds(DataFrame):
    """Script: the realtime service answers with ``chunks`` (start, text, end)."""

    chunks: tuple[str, ...] = ()
    finished: bool = True


try:  # What OpenAIRealtimeLLMService broadcasts on the server VAD's speech_started / speech_stopped:
    # a proposal the user aggregator's turn strategies decide on (1.8 and later), ...
    from pipecat.frames.frames import ProposedUserStartedSpeakingFrame, ProposedUserStoppedSpeakingFrame

    SPEECH_STARTED: type[Frame] = ProposedUserStartedSpeakingFrame
    SPEECH_STOPPED: type[Frame] = ProposedUserStoppedSpeakingFrame
except ImportError:  # ... or the user's turn itself (before 1.8)
    SPEECH_STARTED, SPEECH_STOPPED = UserStartedSpeakingFrame, UserStoppedSpeakingFrame


class RealtimeLLM(LLMService):
    """A speech-to-speech service: it announces ``is_realtime_service`` as OpenAI Realtime does
    (``OpenAIRealtimeLLMService.service_metadata_frame``) and turns the script frames that reach
    it into what OpenAI Realtime pushes: its server VAD's speech start and stop as the frames
    the installed release broadcasts (``_handle_evt_speech_started`` / ``_stopped``: a
    ``ProposedUserStarted/StoppedSpeakingFrame`` from 1.8, the ``UserStarted/StoppedSpeakingFrame``
    before), each input-transcription delta as an upstream ``InterimTranscriptionFrame``
    carrying the event (``_handle_evt_input_audio_transcription_delta``), the completed
    transcript as an upstream ``TranscriptionFrame``, a response downstream."""

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
        elif isinstance(frame, (SpeechStarted, SpeechStopped)):
            started = isinstance(frame, SpeechStarted)
            await self.broadcast_frame(SPEECH_STARTED if started else SPEECH_STOPPED)
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
