"""A Pipecat voice bot for the adapter's crash test, run as its own process:
``python -m tests.adapters.pipecat_voice_agent SESSION``.

Progress goes to stdout as JSON lines (Pipecat logs to stderr). The bot opens
the session with :meth:`TurnlogObserver.open` (resumed if turnlog has it),
builds its ``LLMContext`` from the stored turns as a user would, prints
``{"resumed": bool, "epoch": int, "context": [...messages]}``, and runs a real
``PipelineWorker`` over STT, the aggregator pair (VAD, muted while the bot
speaks: ``AlwaysUserMuteStrategy``), an LLM, a TTS and an output transport
that plays in real time (``tests/adapters/pipecat_call.py``):

- a new session: the caller asks, the bot's LLM calls the ``find_order``
  function (Pipecat's function-calling machinery runs it) and answers with its
  result (with token usage), the caller gives the address, and the bot starts a long answer. Once its first
  two sentences were played, the caller says something while the bot speaks
  (Pipecat drops it: muted). Once the aggregator has processed those words and
  everything is recorded, spooled and acknowledged by the broker, it prints
  ``{"ready": true, "open_turns": [...]}`` and waits, still speaking, to be
  SIGKILLed.
- a resumed session: one more question and answer, then an ``EndFrame``: the
  session ends ("completed"), it prints ``{"ended": bool, "errors": [...]}``
  and exits 0.
"""

from __future__ import annotations

import asyncio
import sys

from pipecat.frames.frames import Frame
from pipecat.observers.base_observer import BaseObserver, FrameProcessed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.turns.user_mute import AlwaysUserMuteStrategy

from turnlog.adapters.pipecat import TurnlogObserver
from turnlog.settings import TurnlogSettings

from tests.adapters.pipecat_agent import STEP_TIMEOUT, SYSTEM, say
from tests.adapters.pipecat_call import Call, says, voice_pair
from tests.adapters.pipecat_services import FunctionCall, Reply, ScriptedLLM, ScriptedSTT, SilentTTS, Speaker
from tests.adapters.stored import FLEET
from tests.support import recorder_for

#: The long rest of the answer the bot is speaking when it is killed (about 30 s of audio).
LONG = " It will take a moment" + " while I check the courier's schedule" * 24 + "."
FIRST_CALL = [
    Reply((), calls=[FunctionCall("find_order", {"caller": "caller"}, call_id="call_find")]),
    Reply(("Of course.", " What is the new address?"), prompt_tokens=20, completion_tokens=8),
    Reply(("Thanks.", " I'm updating your order to 12 Elm Street.", LONG)),
]
RESUMED_CALL = [Reply(("Yes, it ships to", " 12 Elm Street."), prompt_tokens=35, completion_tokens=9)]


class Processed(BaseObserver):
    """The ids of the frames ``processor`` has started processing (Pipecat tells observers
    before the processor's mute filter drops a frame)."""

    def __init__(self, processor: object) -> None:
        super().__init__()
        self.processor = processor
        self.ids: set[int] = set()

    async def on_process_frame(self, data: FrameProcessed) -> None:
        if data.processor is self.processor:
            self.ids.add(data.frame.id)


async def find_order(params) -> None:  # noqa: ANN001
    await params.result_callback({"order": "1234", "address": "3 Oak Lane"})


async def main(session_id: str) -> None:
    async with recorder_for(TurnlogSettings()) as recorder:
        observer = await TurnlogObserver.open(recorder, session_id, fleet=FLEET, agent_id="pipecat-voice")
        context = LLMContext([SYSTEM, *observer.messages])
        say(resumed=observer.resumed, epoch=observer.session.epoch, context=context.messages)
        session = observer.session
        first = session.next_turn_index
        stt, llm, speaker = ScriptedSTT(), ScriptedLLM(RESUMED_CALL if observer.resumed else FIRST_CALL), Speaker()
        llm.register_function("find_order", find_order)
        aggregators = voice_pair(context, mute=[AlwaysUserMuteStrategy()])
        user, assistant = aggregators
        processed = Processed(user)
        bot = Pipeline([stt, user, llm, SilentTTS(seconds_per_word=0.2), speaker, assistant])
        params = PipelineParams(enable_metrics=True, enable_usage_metrics=True)

        def said(turns: int) -> bool:
            return len(context.messages) == 1 + len(observer.messages) + turns and not speaker.bot_speaking

        async with Call(bot, observer, aggregators, params) as call:
            call.worker.add_observer(processed)
            if not observer.resumed:
                await call.send(*says("I'd like to change", "my delivery address.", interim="I'd like"))
                await call.until(lambda: said(4), "the function's result and the first answer played")
                await call.send(*says("12 Elm Street, Springfield."))
                await call.until(lambda: "".join(speaker.spoken).endswith("12 Elm Street."), "two sentences played")
                # The bot speaks on: the caller is muted, and Pipecat drops what they say.
                heard = len(stt.transcribed)
                await call.send(*says("um, hold on", interim="um"))
                await call.until(lambda: len(stt.transcribed) == heard + 2, "the muted words transcribed")
                muted: list[Frame] = stt.transcribed[heard:]
                await call.until(lambda: all(f.id in processed.ids for f in muted), "the muted words processed")
                await observer.drained()
                assert speaker.bot_speaking and session.open_turns == (first + 4,), "not mid-answer"
                await session.flush_partial()
                assert await session.wait_acknowledged(STEP_TIMEOUT), "not acknowledged"
                say(ready=True, open_turns=list(session.open_turns))
                await asyncio.Event().wait()  # until SIGKILL
            await call.send(*says("Did it go through?"))
            await call.until(lambda: said(2), "the answer played")
            await call.end()
        await observer.wait_closed(STEP_TIMEOUT)
        say(ended=session.closed, errors=[str(e) for e in observer.errors])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
