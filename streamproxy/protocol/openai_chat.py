"""Wire schema of `/v1/chat/completions`: request and non-stream response.

Only shapes live here (msgspec Structs) plus the module-level decoder; what
the fields mean for generation is `params.py`'s job, and the streaming chunk
bytes are built from templates in `stream.py`. Unknown request fields are
ignored, as vLLM and the OpenAI SDKs' `extra_body` expect.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from streamproxy.protocol.common import SamplingRequest, Usage


class TemplateRequest(Protocol):
    """What the chat template reads from a request (chat completions, tokenize)."""

    @property
    def add_generation_prompt(self) -> bool: ...
    @property
    def continue_final_message(self) -> bool: ...
    @property
    def chat_template_kwargs(self) -> dict[str, Any] | None: ...
    @property
    def chat_template(self) -> str | None: ...

class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str = ""


class ToolCall(msgspec.Struct):
    function: FunctionCall
    id: str | None = None
    type: str = "function"


class FunctionDefinition(msgspec.Struct, omit_defaults=True):
    name: str
    description: str | None = None
    # A JSON Schema object; None means "no arguments".
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct):
    function: FunctionDefinition
    type: str = "function"


class NamedFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct):
    """tool_choice {"type": "function", "function": {"name": ...}}."""

    function: NamedFunction
    type: str = "function"


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # Legacy `function` role / assistant `function_call`.
    function_call: FunctionCall | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None


class ChatCompletionRequest(SamplingRequest, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False  # null: no logprobs
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # The request's own template: only with --trust-request-chat-template (core.prepare.template_for).
    chat_template: str | None = None
    # Reasoning models: an effort turns thinking on (params.template_kwargs).
    reasoning_effort: str | None = None
    # Tool calling (params.tool_plan) and structured outputs (params.structured_outputs).
    tools: list[Tool] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


decode_request = msgspec.json.Decoder(ChatCompletionRequest).decode


# --- non-stream response -------------------------------------------------


class ResponseToolCall(msgspec.Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class ResponseMessage(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None
    refusal: str | None
    # Left out when empty (omit_defaults), like OpenAI for plain answers.
    tool_calls: list[ResponseToolCall] = []
    # The model's thinking (--reasoning-parser), and the same under its older name.
    reasoning: str | None = None
    reasoning_content: str | None = None


class ChatChoice(msgspec.Struct):
    index: int
    message: ResponseMessage
    logprobs: Any
    finish_reason: str | None
    # vLLM's extra, with `return_token_ids`.
    token_ids: list[int] | msgspec.UnsetType = msgspec.UNSET


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str
    object: str = "chat.completion"
    # vLLM's extra, when the request asked for `prompt_logprobs` (core.logprobs.vllm_prompt_logprobs).
    prompt_logprobs: list[Any] | None | msgspec.UnsetType = msgspec.UNSET
    # vLLM's extra, with `return_token_ids`.
    prompt_token_ids: list[int] | msgspec.UnsetType = msgspec.UNSET
