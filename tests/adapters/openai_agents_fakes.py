"""A fake ``Model`` for the OpenAI Agents SDK: scripted replies, no network.

Each reply is a :class:`Reply` (text, or a function call) with its token usage.
``get_response`` returns it whole; ``stream_response`` streams the text word by
word as ``response.output_text.delta`` events, then ``response.completed``.
A reply with ``hold`` set stops streaming after ``hold`` words and waits
(forever, or until ``release`` is set): the test kills or cancels meanwhile.
``calls`` keeps the input items of every call (what the model was shown);
``called`` is set at the first call.

Each output item gets an id of its own, as the Responses API does, and each
response a ``response_id`` (``resp_<n>``). :func:`fake_chat_client` is a fake
``AsyncOpenAI`` for the SDK's own ``OpenAIChatCompletionsModel``, whose items
all get the SDK's ``FAKE_RESPONSES_ID`` (``agents/models/chatcmpl_converter.py``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from agents import Model, ModelResponse, Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails


@dataclass
class Reply:
    text: str | None = None
    call: tuple[str, str] | None = None  # (tool name, JSON arguments)
    input_tokens: int = 0
    output_tokens: int = 0
    hold: int | None = None  # stream this many words, then wait for `release`
    release: asyncio.Event = field(default_factory=asyncio.Event)


class FakeModel(Model):
    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)
        self.called = asyncio.Event()  # set at the first call
        self.calls: list[list[dict[str, Any]]] = []
        self.count = 0

    def _next(self, input: Any) -> tuple[Reply, list[Any]]:
        self.calls.append([dict(item) for item in input] if isinstance(input, list) else [{"role": "user", "content": input}])
        reply = self.replies.pop(0)
        self.called.set()
        self.count += 1
        n = self.count
        if reply.call is not None:
            name, arguments = reply.call
            output = [ResponseFunctionToolCall(id=f"fc_{n}", call_id=f"call_{n}", name=name, arguments=arguments, type="function_call", status="completed")]
        else:
            output = [
                ResponseOutputMessage(
                    id=f"msg_{n}", type="message", role="assistant", status="completed",
                    content=[ResponseOutputText(text=reply.text or "", type="output_text", annotations=[], logprobs=[])],
                )
            ]
        return reply, output

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, *, previous_response_id=None, conversation_id=None, prompt=None, **kwargs) -> ModelResponse:
        reply, output = self._next(input)
        usage = Usage(requests=1, input_tokens=reply.input_tokens, output_tokens=reply.output_tokens, total_tokens=reply.input_tokens + reply.output_tokens)
        return ModelResponse(output=output, usage=usage, response_id=f"resp_{self.count}")

    async def stream_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, *, previous_response_id=None, conversation_id=None, prompt=None, **kwargs) -> AsyncIterator[Any]:
        reply, output = self._next(input)
        sequence = 0
        if reply.text is not None:
            item_id = output[0].id
            for i, word in enumerate(re.findall(r"\S+\s*", reply.text)):
                if reply.hold is not None and i == reply.hold:
                    await reply.release.wait()
                yield ResponseTextDeltaEvent(
                    type="response.output_text.delta", item_id=item_id, output_index=0, content_index=0,
                    delta=word, logprobs=[], sequence_number=sequence,
                )
                sequence += 1
                await asyncio.sleep(0)
        usage = ResponseUsage(
            input_tokens=reply.input_tokens, output_tokens=reply.output_tokens, total_tokens=reply.input_tokens + reply.output_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0), output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        )
        response = Response(
            id=f"resp_{self.count}", created_at=0, model="fake", object="response", output=output, tool_choice="none",
            tools=[], top_p=None, parallel_tool_calls=False, status="completed", usage=usage,
        )
        yield ResponseCompletedEvent(type="response.completed", response=response, sequence_number=sequence)


class FakeChatCompletions:
    """``client.chat.completions`` of an ``AsyncOpenAI`` for the SDK's own
    ``OpenAIChatCompletionsModel``: scripted text replies, streamed word by word as
    ``ChatCompletionChunk`` objects (the last one with the usage) or returned whole
    as a ``ChatCompletion``. A reply with ``hold`` waits for ``release`` after that
    many words, as :class:`FakeModel` does. The SDK's converter gives every item
    ``FAKE_RESPONSES_ID``. ``calls`` keeps the messages of every request."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)
        self.calls: list[list[dict[str, Any]]] = []

    async def create(self, *, messages: list[dict[str, Any]], stream: Any = False, **_: Any) -> Any:
        from openai.types.chat import ChatCompletion, ChatCompletionChunk
        from openai.types.completion_usage import CompletionUsage

        self.calls.append([dict(m) for m in messages])
        reply = self.replies.pop(0)
        usage = CompletionUsage(prompt_tokens=reply.input_tokens, completion_tokens=reply.output_tokens,
                                total_tokens=reply.input_tokens + reply.output_tokens)
        if stream is not True:
            return ChatCompletion.model_validate({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "fake", "usage": usage.model_dump(),
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply.text}}],
            })

        def chunk(delta: dict[str, Any], finish: str | None = None, with_usage: bool = False) -> ChatCompletionChunk:
            return ChatCompletionChunk.model_validate({
                "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "fake",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                "usage": usage.model_dump() if with_usage else None,
            })

        async def chunks() -> AsyncIterator[ChatCompletionChunk]:
            for i, word in enumerate(re.findall(r"\S+\s*", reply.text or "")):
                if reply.hold is not None and i == reply.hold:
                    await reply.release.wait()
                yield chunk({"role": "assistant", "content": word} if i == 0 else {"content": word})
                await asyncio.sleep(0)
            yield chunk({}, "stop", with_usage=True)

        return chunks()


def fake_chat_client(replies: list[Reply]) -> Any:
    """An ``AsyncOpenAI`` stand-in for ``OpenAIChatCompletionsModel(model, openai_client=...)``;
    its ``chat.completions`` is a :class:`FakeChatCompletions`."""
    from types import SimpleNamespace

    return SimpleNamespace(base_url="http://fake.invalid/v1", chat=SimpleNamespace(completions=FakeChatCompletions(replies)))
