"""A fake ``Model`` for the OpenAI Agents SDK: scripted replies, no network.

Each reply is a :class:`Reply` (text, or a function call) with its token usage.
``get_response`` returns it whole; ``stream_response`` streams the text word by
word as ``response.output_text.delta`` events, then ``response.completed``.
A reply with ``hold`` set stops streaming after ``hold`` words and waits
(forever, or until ``release`` is set): the test kills or cancels meanwhile.
``calls`` keeps the input items of every call (what the model was shown);
``called`` is set at the first call.

``item_id`` set: every output item gets that id, as the SDK's Chat Completions,
LiteLLM and any-llm models give every item ``FAKE_RESPONSES_ID``
(``agents/models/chatcmpl_converter.py``, ``chatcmpl_stream_handler.py``);
unset, each item gets an id of its own, as the Responses API does. Every
response has a ``response_id`` (``resp_<n>``).
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
    def __init__(self, replies: list[Reply], item_id: str | None = None) -> None:
        self.replies = list(replies)
        self.item_id = item_id
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
            output = [ResponseFunctionToolCall(id=self.item_id or f"fc_{n}", call_id=f"call_{n}", name=name, arguments=arguments, type="function_call", status="completed")]
        else:
            output = [
                ResponseOutputMessage(
                    id=self.item_id or f"msg_{n}", type="message", role="assistant", status="completed",
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
