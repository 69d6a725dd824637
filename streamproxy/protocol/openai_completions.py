"""Wire schema of the legacy `/v1/completions` endpoint (vLLM bench's default).

`prompt` may be a string, a list of strings, a list of token ids or a list of
token-id lists, as in OpenAI's API; `params.completion_prompts` normalises
it, and each prompt's choices follow the previous one's (`index` = prompt
number × n + choice). `echo` puts the prompt before each choice's text;
with `max_tokens: 0` (only then allowed) the text is the prompt alone.
"""

from __future__ import annotations

from typing import Any

import msgspec

from streamproxy.protocol.common import SamplingRequest, Usage


class CompletionRequest(SamplingRequest, kw_only=True):
    # str | list[str] | list[int] | list[list[int]]: msgspec allows one array type
    # per union, so the list is checked in params.completion_prompts.
    prompt: str | list[str | int | list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False  # null: false
    suffix: str | None = None
    best_of: int | None = None


decode_request = msgspec.json.Decoder(CompletionRequest).decode


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: Any
    finish_reason: str | None
    # vLLM's extra, when the prompt's logprobs were asked for (`prompt_logprobs`, or echo with logprobs).
    prompt_logprobs: list[Any] | None | msgspec.UnsetType = msgspec.UNSET
    # vLLM's extras, with `return_token_ids`.
    token_ids: list[int] | msgspec.UnsetType = msgspec.UNSET
    prompt_token_ids: list[int] | msgspec.UnsetType = msgspec.UNSET


class Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str
    object: str = "text_completion"
