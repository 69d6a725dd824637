"""Wire schema of OpenAI's Responses API (`POST /v1/responses`): request and response.

Only shapes (unknown fields ignored, as `extra_body` expects); meaning is convert.py's, events and the
final `Response` are stream.py's. Input items share one Struct (`InputItem`): a message item may omit
its `type`, which a tagged union cannot express; the converter checks each item by its type.
"""

from __future__ import annotations

from typing import Any

import msgspec

# --- request ------------------------------------------------------------


class InputContent(msgspec.Struct):
    """A content part: input_text / output_text / refusal / summary_text / reasoning_text, or media."""

    type: str
    text: str | None = None
    refusal: str | None = None
    image_url: Any = None
    file_id: str | None = None


class InputItem(msgspec.Struct):
    type: str = "message"
    # message
    role: str | None = None
    content: str | list[InputContent] | None = None
    # function_call
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    # function_call_output
    output: str | list[InputContent] | None = None
    # reasoning, item_reference
    id: str | None = None
    summary: list[InputContent] | None = None
    encrypted_content: str | None = None
    status: str | None = None


class FunctionTool(msgspec.Struct, omit_defaults=True):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceObject(msgspec.Struct, omit_defaults=True):
    """{"type": "function", "name": ...}; other types (hosted tools) are refused."""

    type: str
    name: str | None = None


class TextFormat(msgspec.Struct, omit_defaults=True):
    """text.format: {"type": "text" | "json_object" | "json_schema", name, schema, strict}."""

    type: str
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct, omit_defaults=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningConfig(msgspec.Struct):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    input: str | list[InputItem] | None = None
    model: str | None = None
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | ToolChoiceObject | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool | None = False  # null: not streaming, as OpenAI reads it
    store: bool | None = None  # kept for GET /v1/responses/{id} when the server's store is on (store.py)
    previous_response_id: str | None = None  # refused: send the conversation in `input`
    conversation: Any = None  # refused, for the same reason
    background: bool | None = None
    prompt: Any = None  # stored prompt templates: refused
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None
    truncation: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # vLLM-style sampling extensions, as on chat.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    # Ours, as on chat (docs/api.md, "Token ids", "Continuing a stream"): the stream's events carry the
    # prompt's and each step's token ids; the ids this same request already generated (a gateway's).
    return_token_ids: bool | None = None
    continue_token_ids: list[int] | None = None


decode_request = msgspec.json.Decoder(ResponsesRequest).decode


# --- response -----------------------------------------------------------


class OutputText(msgspec.Struct, kw_only=True):
    type: str = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(msgspec.Struct, kw_only=True):
    id: str
    type: str = "message"
    status: str
    role: str = "assistant"
    content: list[OutputText]


class FunctionCallItem(msgspec.Struct, kw_only=True):
    id: str
    type: str = "function_call"
    status: str
    arguments: str
    call_id: str
    name: str


class ReasoningText(msgspec.Struct, kw_only=True):
    type: str = "reasoning_text"
    text: str


class ReasoningItem(msgspec.Struct, kw_only=True):
    id: str
    type: str = "reasoning"
    summary: list[Any] = []
    content: list[ReasoningText]
    encrypted_content: str | None = None
    status: str


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int = 0  # prompt tokens read from the engine's prefix cache
    cache_write_tokens: int = 0  # newer OpenAI field (required by current SDKs); nothing is billed for writes here


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(msgspec.Struct):
    reason: str


class ResponseError(msgspec.Struct):
    code: str
    message: str


class ReasoningEcho(msgspec.Struct):
    effort: str | None = None
    summary: str | None = None


class TextEcho(msgspec.Struct):
    format: TextFormat


class Response(msgspec.Struct, kw_only=True):
    id: str
    object: str = "response"
    created_at: int
    status: str
    background: bool = False
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    output: list[Any]
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: ReasoningEcho
    service_tier: str = "default"
    store: bool = False
    temperature: float | None = None
    text: TextEcho
    tool_choice: Any = "auto"
    tools: list[FunctionTool] = []
    top_logprobs: int = 0
    top_p: float | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = {}


encode = msgspec.json.Encoder().encode
