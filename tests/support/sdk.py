"""Narrowing what the OpenAI and Anthropic SDKs type loosely, so tests type-check and still assert.

    text_of(block)      an Anthropic content block's text (asserts it is a TextBlock)
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
