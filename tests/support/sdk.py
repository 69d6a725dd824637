"""Narrowing what the OpenAI and Anthropic SDKs type loosely, so tests type-check and still assert.

    text_of(block)      an Anthropic content block's text (asserts it is a TextBlock)
    function_calls(m)   a chat message's tool calls as (name, arguments), each asserted a function call
    error_body(exc)     an SDK APIStatusError's parsed JSON body (asserts it is an object)
"""

from __future__ import annotations

from typing import Any

from anthropic.types import TextBlock


def text_of(block: object) -> str:
    """The SDK types `content[i]` as a union of every block kind; a test expecting text asserts it."""
    assert isinstance(block, TextBlock), block
    return block.text


def error_body(exc: Exception) -> dict[str, Any]:
    """`exc.body` of an `openai.APIStatusError` / `anthropic.APIStatusError` (typed `object`), a JSON object."""
    body = getattr(exc, "body", None)
    assert isinstance(body, dict), body
    return body


def function_calls(message: Any) -> list[tuple[str, str]]:
    """(name, arguments) of a chat message's tool calls, each asserted to be a function call (the SDK
    types `tool_calls` as optional, and as a union with custom tool calls)."""
    from openai.types.chat import ChatCompletionMessageFunctionToolCall

    calls = message.tool_calls
    assert calls is not None, message
    assert all(isinstance(c, ChatCompletionMessageFunctionToolCall) for c in calls), calls
    return [(c.function.name, c.function.arguments) for c in calls]
