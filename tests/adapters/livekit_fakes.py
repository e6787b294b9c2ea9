"""A small scripted ``llm.LLM`` for driving a real LiveKit ``AgentSession`` without network.

Modelled on livekit/agents' own ``tests/fake_llm.py``: the reply is chosen by
the text of the last user message, streamed in chunks through LiveKit's
``LLMStream`` machinery, with the token usage sent first (so a reply cut short
still reports its tokens, as LiveKit's metrics do for a cancelled stream).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from livekit import rtc
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    NOT_GIVEN,
    Agent,
    APIConnectionError,
    APIConnectOptions,
    NotGivenOr,
    StopResponse,
    stt,
    utils,
    vad,
)
from livekit.agents.llm import (
    LLM,
    ChatChunk,
    ChatContext,
    ChoiceDelta,
    CompletionUsage,
    FunctionToolCall,
    LLMStream,
    Tool,
    ToolChoice,
)
from livekit.agents.tts import TTS, AudioEmitter, ChunkedStream, SynthesizeStream, TTSCapabilities
from livekit.agents.voice.io import AudioInput, AudioOutput, AudioOutputCapabilities, TextOutput
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer


@dataclass(frozen=True)
class Reply:
    """What the fake LLM answers: ``text`` in ``chunk_chars``-character chunks,
    ``chunk_seconds`` apart, after a usage chunk of the given token counts.
    ``fail``: the request fails instead, with an error LiveKit does not retry.
    ``tool_call``: ``(tool name, JSON arguments)``: the model first calls that tool (LiveKit
    runs it), and answers ``text`` once the tool's output is in the context."""

    text: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    chunk_chars: int = 4
    chunk_seconds: float = 0.0
    fail: bool = False
    tool_call: tuple[str, str] | None = None


class ScriptedLLM(LLM):
    """Answers the last user message from ``replies`` (text -> :class:`Reply`).

    ``contexts`` holds, per call, the messages it was given as
    ``(role, text, interrupted)`` tuples: what the model saw.
    """

    def __init__(self, replies: Mapping[str, Reply]) -> None:
        super().__init__()
        self.replies = dict(replies)
        self.contexts: list[list[tuple[str, str | None, bool]]] = []
        #: per call, the items of the context it was given
        self.items: list[list[Any]] = []

    @property
    def model(self) -> str:
        return "scripted"

    @property
    def provider(self) -> str:
        return "tests"

    def chat(
        self,
        *,
        chat_ctx: ChatContext,
        tools: list[Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: NotGivenOr[bool] = NOT_GIVEN,
        tool_choice: NotGivenOr[ToolChoice] = NOT_GIVEN,
        extra_kwargs: NotGivenOr[dict[str, Any]] = NOT_GIVEN,
    ) -> LLMStream:
        self.contexts.append([(m.role, m.text_content, m.interrupted) for m in chat_ctx.messages()])
        self.items.append(list(chat_ctx.items))
        return _ScriptedStream(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


def item_view(item: Any) -> tuple[Any, ...]:
    """A context item as the model reads it: a message's role and text, a tool call's name and
    arguments (parsed), a tool output's name, text and error flag."""
    if item.type == "message":
        return ("message", item.role, item.text_content)
    if item.type == "function_call":
        return ("function_call", item.name, json.loads(item.arguments or "{}"))
    if item.type == "function_call_output":
        return ("function_call_output", item.name, item.output, item.is_error)
    return (item.type,)


def conversation_items(items: Any) -> list[tuple[Any, ...]]:
    """:func:`item_view` of the user's and assistant's messages and the tool calls and outputs
    among ``items`` (a context's or a history's), in order; handoffs and instructions left out."""
    views = [item_view(item) for item in items]
    return [view for view in views if view[0] in ("function_call", "function_call_output")
            or view[:2] in (("message", "user"), ("message", "assistant"))]


class _ScriptedStream(LLMStream):
    def __init__(self, llm: ScriptedLLM, *, chat_ctx: ChatContext, tools: list[Tool], conn_options: APIConnectOptions) -> None:
        super().__init__(llm, chat_ctx=chat_ctx, tools=tools, conn_options=conn_options)
        self._scripted = llm

    async def _run(self) -> None:
        users = [m for m in self.chat_ctx.messages() if m.role == "user"]
        reply = self._scripted.replies[users[-1].text_content or ""]
        if reply.fail:
            raise APIConnectionError("the scripted model failed", retryable=False)
        request = f"scripted-{id(self)}"
        usage = CompletionUsage(
            completion_tokens=reply.output_tokens,
            prompt_tokens=reply.input_tokens,
            total_tokens=reply.input_tokens + reply.output_tokens,
        )
        self._event_ch.send_nowait(ChatChunk(id=request, usage=usage))
        if reply.tool_call is not None and not self._tool_answered():
            name, arguments = reply.tool_call
            call = FunctionToolCall(name=name, arguments=arguments, call_id=f"call-{id(self)}")
            self._event_ch.send_nowait(ChatChunk(id=request, delta=ChoiceDelta(role="assistant", tool_calls=[call])))
            return
        for start in range(0, len(reply.text), reply.chunk_chars):
            if reply.chunk_seconds:
                await asyncio.sleep(reply.chunk_seconds)
            piece = reply.text[start : start + reply.chunk_chars]
            self._event_ch.send_nowait(ChatChunk(id=request, delta=ChoiceDelta(role="assistant", content=piece)))


    def _tool_answered(self) -> bool:
        """True when a tool's output follows the last user message in the context."""
        items = list(self.chat_ctx.items)
        last_user = max((i for i, item in enumerate(items) if getattr(item, "role", None) == "user"), default=-1)
        return any(item.type == "function_call_output" for item in items[last_user + 1:])


class CapturedText(TextOutput):
    """A text output that keeps what reaches it (what RoomIO's transcription output would
    send to the room): ``segments`` holds one string per flushed segment."""

    def __init__(self) -> None:
        super().__init__(label="captured", next_in_chain=None)
        self.segments: list[str] = []
        self._current = ""

    @property
    def current(self) -> str:
        """The text of the segment still being sent."""
        return self._current

    async def capture_text(self, text: str) -> None:
        self._current += text

    def flush(self) -> None:
        self.segments.append(self._current)
        self._current = ""


# -- the voice path: a TTS that makes silence, an audio output that "plays" it in real time --
class SilentTTS(TTS):
    """A streaming TTS: each flushed piece of text becomes ``seconds_per_char`` seconds
    of silence per character (after livekit/agents' ``tests/fake_tts.py``)."""

    def __init__(self, *, seconds_per_char: float = 0.02, sample_rate: int = 24000) -> None:
        super().__init__(capabilities=TTSCapabilities(streaming=True), sample_rate=sample_rate, num_channels=1)
        self.seconds_per_char = seconds_per_char

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> ChunkedStream:
        raise NotImplementedError("SilentTTS only streams")

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        return _SilentStream(tts=self, conn_options=conn_options)


class _SilentStream(SynthesizeStream):
    async def _run(self, output_emitter: AudioEmitter) -> None:
        tts = self._tts
        assert isinstance(tts, SilentTTS)
        output_emitter.initialize(
            request_id=utils.shortuuid("silent_"), sample_rate=tts.sample_rate, num_channels=1, mime_type="audio/pcm", stream=True
        )
        text = ""
        async for data in self._input_ch:
            if isinstance(data, str):
                text += data
                continue
            if not text:
                continue
            self._mark_started()
            output_emitter.start_segment(segment_id=utils.shortuuid("silent_segment_"))
            samples = int(tts.sample_rate * tts.seconds_per_char * len(text))
            for start in range(0, samples, tts.sample_rate // 100):
                output_emitter.push(b"\x00\x00" * min(tts.sample_rate // 100, samples - start))
            output_emitter.flush()
            text = ""


class RealTimeAudioOutput(AudioOutput):
    """Plays captured audio in real time (nothing is heard: only the clock runs), and
    reports playback as a room's audio output does (after livekit/agents' ``tests/fake_io.py``)."""

    def __init__(self) -> None:
        super().__init__(label="realtime", capabilities=AudioOutputCapabilities(pause=False))
        self._pushed = 0.0
        self._started_at: float | None = None
        self._finish: asyncio.TimerHandle | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        self._pushed += frame.duration
        if self._started_at is None:
            self._started_at = time.time()
            self.on_playback_started(created_at=self._started_at)

    def flush(self) -> None:
        super().flush()
        if not self._pushed or self._started_at is None:
            return
        pushed = self._pushed
        delay = max(pushed - (time.time() - self._started_at), 0.0)

        def finished() -> None:
            self._reset()
            self.on_playback_finished(playback_position=pushed, interrupted=False)

        if self._finish is not None:
            self._finish.cancel()
        self._finish = asyncio.get_running_loop().call_later(delay, finished)

    def clear_buffer(self) -> None:
        if not self._pushed or self._started_at is None:
            return
        position = min(time.time() - self._started_at, self._pushed)
        self._reset()
        self.on_playback_finished(playback_position=position, interrupted=True)

    def _reset(self) -> None:
        self._pushed, self._started_at = 0.0, None
        if self._finish is not None:
            self._finish.cancel()
            self._finish = None


def voice_outputs(session: Any) -> CapturedText:
    """Give ``session`` the audio and transcription outputs RoomIO would: a
    TranscriptSynchronizer that releases the text as the audio plays. Returns the
    text output behind it (what the room would be sent)."""
    room_text = CapturedText()
    synchronizer = TranscriptSynchronizer(next_in_chain_audio=RealTimeAudioOutput(), next_in_chain_text=room_text)
    session.output.audio = synchronizer.audio_output
    session.output.transcription = synchronizer.text_output
    return room_text


# -- a LiveKit job, run by LiveKit's job process ------------------------------------------
class _SilentIPC:
    """The job process's IPC client: the messages to the parent process go nowhere."""

    async def send(self, message: Any) -> None:
        return None


async def run_job(entrypoint: Any, *, shutdown: str) -> None:
    """Run ``entrypoint(ctx)`` as LiveKit's job process runs a job (a fake job: a mock
    room), ``_JobProc._start_job`` then its job task (``livekit/agents/ipc/
    job_proc_lazy_main.py``), and end the job once the entrypoint has returned, as
    ``shutdown`` says: ``"ctx.shutdown"`` (``JobContext.shutdown()``), ``"drain timeout"``
    (what the process does on the parent's ``ShutdownRequest``, sent when a draining
    worker's timeout expires) or ``"job crashed"`` (the entrypoint raises). LiveKit's
    shutdown sequence then runs: ``session.aclose()`` on the primary session, then the
    job's shutdown callbacks. Returns when the job task is done; raises what ``entrypoint``
    raised (LiveKit's job process only logs it)."""
    from livekit.agents.ipc.job_proc_lazy_main import _JobProc, _ShutdownInfo
    from livekit.agents.ipc.proto import StartJobRequest
    from livekit.agents.job import JobExecutorType, JobProcess
    from livekit.agents.testing import fake_job_context

    class _Crash(Exception):
        pass

    failures: list[BaseException] = []

    async def job_entrypoint(ctx: Any) -> None:
        try:
            await entrypoint(ctx)
        except BaseException as e:  # LiveKit's job process only logs an entrypoint's failure
            failures.append(e)
            raise
        if shutdown == "ctx.shutdown":
            ctx.shutdown()
        elif shutdown == "drain timeout":
            proc._shutdown_fut.set_result(_ShutdownInfo(user_initiated=False, reason="draining timed out"))
        else:
            raise _Crash("the entrypoint crashed")

    proc = _JobProc(lambda _: None, job_entrypoint, None, session_end_timeout=10.0, executor_type=JobExecutorType.THREAD)
    proc._client = _SilentIPC()  # type: ignore[assignment]
    proc._job_proc = JobProcess(executor_type=JobExecutorType.THREAD, user_arguments=None, http_proxy=None)
    proc._inf_client = None  # type: ignore[assignment]
    proc._exit_proc_flag = asyncio.Event()
    proc._shutdown_fut = asyncio.get_running_loop().create_future()
    with fake_job_context() as template:  # a fake job's RunningJobInfo, as LiveKit's testing helper makes it
        info = template._info
    request = StartJobRequest()
    request.running_job = info
    proc._start_job(request)
    assert proc._job_task is not None
    await proc._job_task
    if failures:  # an assertion of the test's entrypoint fails the test
        raise failures[0]


async def shut_down_job(job: Any, *, reason: str, user_initiated: bool) -> None:
    """Run LiveKit's own job shutdown sequence on ``job`` (a ``fake_job_context``): the
    job process's ``_JobProc._shutdown_job`` (``livekit/agents/ipc/job_proc_lazy_main.py``),
    in a task named as the job process names the job's task. It waits for the (finished)
    entrypoint, closes the primary session with ``session.aclose()``, then runs the
    job's shutdown callbacks. ``reason``/``user_initiated`` are its ``_ShutdownInfo``:
    ``("user requested", True)`` for ``ctx.shutdown()``, ``("job crashed", False)`` for a
    crashed entrypoint, a parent's reason (a drain timeout) with False."""
    from livekit.agents.ipc.job_proc_lazy_main import _JobProc, _ShutdownInfo
    from livekit.agents.ipc.mock_room import create_mock_room
    from livekit.agents.job import JobExecutorType

    proc = _JobProc(lambda _: None, lambda _: None, None, session_end_timeout=10.0, executor_type=JobExecutorType.THREAD)
    proc._job_ctx = job
    proc._room = create_mock_room()
    proc._client = _SilentIPC()  # type: ignore[assignment]
    entrypoint = asyncio.create_task(asyncio.sleep(0), name="job_user_entrypoint")
    await entrypoint
    info = _ShutdownInfo(user_initiated=user_initiated, reason=reason)
    await asyncio.create_task(proc._shutdown_job(entrypoint, info), name="job_task")


# -- a realtime model whose user transcript comes after its reply -----------------------------
class LateTranscriptRealtime:
    """Builds a text-only ``llm.RealtimeModel`` (server-side turn detection and user
    transcription) that behaves as providers that send the user's transcript after
    the reply do: :meth:`user_turn` emits, on the model's session, what LiveKit's
    ``AgentActivity`` listens to - ``input_speech_started``, ``input_speech_stopped``,
    ``generation_created`` with the reply streamed, and only then
    ``input_audio_transcription_completed`` with the transcript, stamped with when
    the turn began (``turn_started_at``, where the release has it)."""

    def __init__(self) -> None:
        from livekit.agents import llm

        self.sessions: list[Any] = []
        outer = self

        class _Session(llm.RealtimeSession):
            def __init__(self, model: Any) -> None:
                super().__init__(model)
                self._chat_ctx = llm.ChatContext.empty()
                self._tools = llm.ToolContext.empty()
                outer.sessions.append(self)

            @property
            def chat_ctx(self) -> Any:
                return self._chat_ctx.copy()

            @property
            def tools(self) -> Any:
                return self._tools.copy()

            async def update_instructions(self, instructions: str) -> None:
                return None

            async def update_chat_ctx(self, chat_ctx: Any) -> None:
                self._chat_ctx = chat_ctx.copy()

            async def update_tools(self, tools: list[Any]) -> None:
                return None

            def update_options(self, *, tool_choice: Any = NOT_GIVEN) -> None:
                return None

            def push_audio(self, frame: Any) -> None:
                return None

            def push_video(self, frame: Any) -> None:
                return None

            def generate_reply(self, *, instructions: Any = NOT_GIVEN, **_: Any) -> Any:
                raise NotImplementedError("replies come from the user's turns only")

            def commit_audio(self) -> None:
                return None

            def clear_audio(self) -> None:
                return None

            def interrupt(self) -> None:
                return None

            def truncate(self, **_: Any) -> None:
                return None

            async def aclose(self) -> None:
                return None

        class _Model(llm.RealtimeModel):
            def __init__(self) -> None:
                super().__init__(
                    capabilities=llm.RealtimeCapabilities(
                        message_truncation=False, turn_detection=True, user_transcription=True,
                        auto_tool_reply_generation=False, audio_output=False, manual_function_calls=False,
                    )
                )

            def session(self, **_: Any) -> Any:
                return _Session(self)

            async def aclose(self) -> None:
                return None

        self.model = _Model()

    def report_usage(self, *, input_tokens: int, output_tokens: int, request_id: str) -> None:
        """The provider's usage for a response, as a realtime session reports it
        (``metrics_collected`` with ``RealtimeModelMetrics``, which LiveKit's activity adds
        to the session's usage)."""
        from livekit.agents.metrics import RealtimeModelMetrics

        details = RealtimeModelMetrics.InputTokenDetails(audio_tokens=0, text_tokens=input_tokens, image_tokens=0,
                                                         cached_tokens=0, cached_tokens_details=None)
        output = RealtimeModelMetrics.OutputTokenDetails(text_tokens=output_tokens, audio_tokens=0, image_tokens=0)
        self.sessions[-1].emit("metrics_collected", RealtimeModelMetrics(
            request_id=request_id, timestamp=time.time(), cancelled=True, input_tokens=input_tokens,
            output_tokens=output_tokens, total_tokens=input_tokens + output_tokens,
            input_token_details=details, output_token_details=output,
        ))

    async def user_turn(self, transcript: str, reply: str, *, item_id: str) -> None:
        """The user says ``transcript``; the model answers ``reply`` (text), and sends the
        transcript once the reply is generated."""
        import dataclasses

        from livekit.agents import llm

        session = self.sessions[-1]
        began = time.time()
        session.emit("input_speech_started", llm.InputSpeechStartedEvent())
        session.emit("input_speech_stopped", llm.InputSpeechStoppedEvent(user_transcription_enabled=True))
        text_ch: utils.aio.Chan[str] = utils.aio.Chan()
        audio_ch: utils.aio.Chan[rtc.AudioFrame] = utils.aio.Chan()
        message_ch: utils.aio.Chan[llm.MessageGeneration] = utils.aio.Chan()
        function_ch: utils.aio.Chan[llm.FunctionCall] = utils.aio.Chan()
        modalities: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        modalities.set_result(["text"])
        message_ch.send_nowait(llm.MessageGeneration(message_id=f"reply-{item_id}", text_stream=text_ch,
                                                     audio_stream=audio_ch, modalities=modalities))
        message_ch.close()
        function_ch.close()
        session.emit("generation_created", llm.GenerationCreatedEvent(message_stream=message_ch, function_stream=function_ch,
                                                                      user_initiated=False))
        for start in range(0, len(reply), 4):
            text_ch.send_nowait(reply[start : start + 4])
            await asyncio.sleep(0.01)
        text_ch.close()
        audio_ch.close()
        fields = {f.name for f in dataclasses.fields(llm.InputTranscriptionCompleted)}
        extra = {"turn_started_at": began} if "turn_started_at" in fields else {}
        session.emit("input_audio_transcription_completed",
                     llm.InputTranscriptionCompleted(item_id=item_id, transcript=transcript, is_final=True, **extra))


# -- a user heard through LiveKit's own audio recognition ---------------------------------
class _ScriptedVADStream(vad.VADStream):
    async def _main_task(self) -> None:
        async for _ in self._input_ch:  # the audio is not listened to: the test says when the user speaks
            pass


class ScriptedVAD(vad.VAD):
    """A VAD whose streams report speech when the test says so (:class:`ScriptedUser`)."""

    def __init__(self) -> None:
        super().__init__(capabilities=vad.VADCapabilities(update_interval=0.05))
        self.streams: list[_ScriptedVADStream] = []

    def stream(self) -> vad.VADStream:
        stream = _ScriptedVADStream(self)
        self.streams.append(stream)
        return stream


class _ScriptedSTTStream(stt.RecognizeStream):
    async def _run(self) -> None:
        async for _ in self._input_ch:
            pass


class ScriptedSTT(stt.STT):
    """A streaming STT whose streams transcribe what the test says (:class:`ScriptedUser`)."""

    def __init__(self) -> None:
        super().__init__(capabilities=stt.STTCapabilities(streaming=True, interim_results=True))
        self.streams: list[_ScriptedSTTStream] = []

    async def _recognize_impl(self, buffer: Any, *, language: Any = NOT_GIVEN, conn_options: APIConnectOptions) -> stt.SpeechEvent:
        raise NotImplementedError("ScriptedSTT only streams")

    def stream(self, *, language: Any = NOT_GIVEN, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> stt.RecognizeStream:
        stream = _ScriptedSTTStream(stt=self, conn_options=conn_options)
        self.streams.append(stream)
        return stream


class SilentAudioInput(AudioInput):
    """The room's audio input: one frame of silence, enough to start LiveKit's VAD and STT streams
    (after livekit/agents' ``tests/fake_io.py``)."""

    def __init__(self) -> None:
        super().__init__(label="silent")
        self._frames: utils.aio.Chan[rtc.AudioFrame] = utils.aio.Chan()
        self._frames.send_nowait(rtc.AudioFrame(data=b"\x00\x00" * 1600, sample_rate=16000, num_channels=1, samples_per_channel=1600))

    async def __anext__(self) -> rtc.AudioFrame:
        return await self._frames.__anext__()


class ScriptedUser:
    """A user LiveKit hears through its own audio recognition (``voice/audio_recognition.py``):
    a VAD that reports speech and an STT that transcribes it when the test says so, behind
    an audio input. LiveKit then does the rest: the user's state, the transcripts, the end
    of the user's turn (VAD turn detection) and what becomes of it.

    ``session_options()`` are the ``AgentSession`` arguments; :meth:`attach` sets the
    session's audio input (before ``session.start``)."""

    def __init__(self) -> None:
        self.vad = ScriptedVAD()
        self.stt = ScriptedSTT()
        self._spoke_for = 0.0

    def session_options(self, *, endpointing_delay: float = 0.2) -> dict[str, Any]:
        return {
            "vad": self.vad,
            "stt": self.stt,
            "user_away_timeout": None,
            "turn_handling": {
                "turn_detection": "vad",
                "endpointing": {"min_delay": endpointing_delay, "max_delay": endpointing_delay * 5},
                "interruption": {"min_duration": 0.1, "min_words": 0, "false_interruption_timeout": None},
                "preemptive_generation": {"enabled": False},
            },
            "aec_warmup_duration": None,
        }

    def attach(self, session: Any) -> None:
        session.input.audio = SilentAudioInput()

    @property
    def listening(self) -> bool:
        """True once LiveKit's audio recognition opened its VAD and STT streams."""
        return bool(self.vad.streams) and bool(self.stt.streams)

    def starts_speaking(self) -> None:
        self._spoke_for = 0.0
        self._vad(vad.VADEventType.START_OF_SPEECH, speaking=True)

    def keeps_speaking(self, seconds: float = 0.3) -> None:
        """A VAD inference while the user speaks (what lets LiveKit interrupt the agent)."""
        self._spoke_for += seconds
        self._vad(vad.VADEventType.INFERENCE_DONE, speaking=True)

    def stops_speaking(self) -> None:
        self._vad(vad.VADEventType.END_OF_SPEECH, speaking=False)

    def is_heard(self, text: str, *, final: bool = True) -> None:
        kind = stt.SpeechEventType.FINAL_TRANSCRIPT if final else stt.SpeechEventType.INTERIM_TRANSCRIPT
        self.stt.streams[-1]._event_ch.send_nowait(stt.SpeechEvent(type=kind, alternatives=[stt.SpeechData(text=text, language="en")]))

    def _vad(self, kind: vad.VADEventType, *, speaking: bool) -> None:
        self.vad.streams[-1]._event_ch.send_nowait(
            vad.VADEvent(
                type=kind, samples_index=0, timestamp=time.time(), speech_duration=self._spoke_for if speaking else 0.0,
                silence_duration=0.0 if speaking else 0.3, speaking=speaking, raw_accumulated_speech=self._spoke_for,
            )
        )


class Gatekeeper(Agent):
    """An agent that answers nothing to "never mind": its ``on_user_turn_completed``
    raises LiveKit's ``StopResponse``."""

    async def on_user_turn_completed(self, turn_ctx: ChatContext, new_message: Any) -> None:
        if new_message.text_content == "never mind":
            raise StopResponse()
