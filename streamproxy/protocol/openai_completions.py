"""Wire schema of the legacy `/v1/completions` endpoint (vLLM bench's default).

`prompt` may be a string, a list of strings, a list of token ids or a list of
token-id lists, as in OpenAI's API; `params.py` normalises it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from streamproxy.protocol.common import ResponseFormat, StreamOptions, Usage


class CompletionRequest(msgspec.Struct):
    # str | list[str] | list[int] | list[list[int]]: msgspec allows one array type
    # per union, so the list is checked in params.completion_prompts.
    prompt: str | list[str | int | list[int]]
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = 16
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    user: str | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    response_format: ResponseFormat | None = None
    # vLLM's structured-output extensions, as on chat.
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


decode_request = msgspec.json.Decoder(CompletionRequest).decode


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: Any
    finish_reason: str | None


class Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str
    object: str = "text_completion"
