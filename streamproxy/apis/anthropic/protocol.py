"""Wire schema of Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`).

Only shapes live here: the requests (decoded once, unknown fields ignored),
the non-stream `Message` answer and Anthropic's error envelope. What the
request means for generation is `convert_anthropic.py`'s job; the stream
events are built in `anthropic_stream.py`.

Content blocks share one Struct (`Block`): Anthropic's block types (text,
image, tool_use, tool_result, thinking, ...) differ only in which fields they
carry, and the converter checks each block's fields by its type.
"""

from __future__ import annotations

from typing import Any

import msgspec

# --- requests -----------------------------------------------------------


class Block(msgspec.Struct):
    type: str
    text: str | None = None
    # tool_use
    id: str | None = None
    name: str | None = None
    input: Any = None
    # tool_result: a string or a list of blocks
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None
    # thinking / redacted_thinking
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    # accepted and ignored
    cache_control: Any = None
    citations: Any = None
    source: Any = None


class InputMessage(msgspec.Struct):
    role: str
    content: str | list[Block]


class SystemBlock(msgspec.Struct):
    type: str
    text: str | None = None
    cache_control: Any = None


class Tool(msgspec.Struct, omit_defaults=True):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    # Absent or "custom" for client tools; server tools (web_search_...) are refused.
    type: str | None = None
    cache_control: Any = None


class ToolChoice(msgspec.Struct):
    type: str  # auto | any | tool | none
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(msgspec.Struct):
    type: str  # enabled | disabled | adaptive
    budget_tokens: int | None = None


class OutputFormat(msgspec.Struct):
    type: str  # json_schema
    schema: dict[str, Any] | None = None


class OutputConfig(msgspec.Struct):
    effort: str | None = None
    format: OutputFormat | None = None


class Metadata(msgspec.Struct):
    user_id: str | None = None


class CountTokensRequest(msgspec.Struct, kw_only=True):
    messages: list[InputMessage]
    model: str | None = None
    system: str | list[SystemBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: str | None = None
    # Ours, as on chat (docs/api.md, "Token ids", "Continuing a stream"): the stream's events carry the
    # prompt's and each step's token ids; the ids this same request already generated (a gateway's).
    return_token_ids: bool | None = None
    continue_token_ids: list[int] | None = None


decode_request = msgspec.json.Decoder(MessagesRequest).decode
decode_count_request = msgspec.json.Decoder(CountTokensRequest).decode


# --- responses ----------------------------------------------------------


class TextBlock(msgspec.Struct, kw_only=True):
    type: str = "text"
    text: str


class ThinkingBlock(msgspec.Struct, kw_only=True):
    type: str = "thinking"
    thinking: str
    signature: str = ""  # no signature: this server does not sign its reasoning


class ToolUseBlock(msgspec.Struct, kw_only=True):
    type: str = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class Usage(msgspec.Struct, kw_only=True):
    """Anthropic's usage: `input_tokens` excludes what was read from the prefix cache."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class Message(msgspec.Struct, kw_only=True):
    id: str
    type: str = "message"
    role: str = "assistant"
    model: str
    content: list[Any]
    stop_reason: str | None
    stop_sequence: str | None
    usage: Usage


class TokenCount(msgspec.Struct):
    input_tokens: int


class ErrorBody(msgspec.Struct):
    type: str
    message: str


class ErrorEnvelope(msgspec.Struct, kw_only=True):
    type: str = "error"
    error: ErrorBody


encode = msgspec.json.Encoder().encode
