"""A small scripted ``llm.LLM`` for driving a real LiveKit ``AgentSession`` without network.

Modelled on livekit/agents' own ``tests/fake_llm.py``: the reply is chosen by
the text of the last user message, streamed in chunks through LiveKit's
``LLMStream`` machinery, with the token usage sent first (so a reply cut short
still reports its tokens, as LiveKit's metrics do for a cancelled stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from livekit.agents import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, APIConnectionError, APIConnectOptions, NotGivenOr
from livekit.agents.llm import LLM, ChatChunk, ChatContext, ChoiceDelta, CompletionUsage, LLMStream, Tool, ToolChoice
from livekit.agents.voice.io import TextOutput


@dataclass(frozen=True)
class Reply:
    """What the fake LLM answers: ``text`` in ``chunk_chars``-character chunks,
    ``chunk_seconds`` apart, after a usage chunk of the given token counts.
    ``fail``: the request fails instead, with an error LiveKit does not retry."""

    text: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    chunk_chars: int = 4
    chunk_seconds: float = 0.0
    fail: bool = False


class ScriptedLLM(LLM):
    """Answers the last user message from ``replies`` (text -> :class:`Reply`).

    ``contexts`` holds, per call, the messages it was given as
    ``(role, text, interrupted)`` tuples: what the model saw.
    """

    def __init__(self, replies: Mapping[str, Reply]) -> None:
        super().__init__()
        self.replies = dict(replies)
        self.contexts: list[list[tuple[str, str | None, bool]]] = []

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
        return _ScriptedStream(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


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
        for start in range(0, len(reply.text), reply.chunk_chars):
            if reply.chunk_seconds:
                await asyncio.sleep(reply.chunk_seconds)
            piece = reply.text[start : start + reply.chunk_chars]
            self._event_ch.send_nowait(ChatChunk(id=request, delta=ChoiceDelta(role="assistant", content=piece)))


class CapturedText(TextOutput):
    """A text output that keeps what reaches it (what RoomIO's transcription output would
    send to the room): ``segments`` holds one string per flushed segment."""

    def __init__(self) -> None:
        super().__init__(label="captured", next_in_chain=None)
        self.segments: list[str] = []
        self._current = ""

    async def capture_text(self, text: str) -> None:
        self._current += text

    def flush(self) -> None:
        self.segments.append(self._current)
        self._current = ""
