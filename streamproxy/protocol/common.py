"""Shapes shared by several OpenAI endpoints: usage, stream options, response_format, models."""

from __future__ import annotations

from typing import Any

import msgspec


class StreamOptions(msgspec.Struct):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(msgspec.Struct, omit_defaults=True):
    name: str = "response"
    # `schema` is the JSON Schema the output must match.
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct):
    """`response_format`: {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}."""

    type: str
    json_schema: JsonSchemaFormat | None = None


class SamplingRequest(msgspec.Struct, kw_only=True):
    """The fields chat and completions requests share: sampling, stop, vLLM's extensions.

    A field OpenAI types as nullable (`"stream": null`, `"n": null`, which the
    SDKs send for an explicit None) decodes as null, and null means its default.
    """

    model: str | None = None
    stream: bool | None = False  # null: not streaming
    stream_options: StreamOptions | None = None
    n: int | None = 1  # null: 1 (`params.choices`)
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
    user: str | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # vLLM's extra: the top k logprobs of every prompt token (-1: all), non-stream only.
    prompt_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extensions: {"json"|"regex"|"choice"|"grammar"|"json_object": ...} and the older guided_* fields.
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's extra: the prompt's and each choice's token ids in the answer (a stream: the prompt's on the
    # first chunk, each chunk its own).
    return_token_ids: bool | None = None
    # Ours (docs/api.md, "Continuing a stream"): the ids this same request already generated; the stream
    # goes on after them, as if they had just been sent (core/continuation.py).
    continue_token_ids: list[int] | None = None


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int = 0


class CompletionTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    # Only with a reasoning parser: how many completion tokens were thinking.
    completion_tokens_details: CompletionTokensDetails | None = None


def usage(prompt: int, completion: int, cached: int, reasoning: int | None = None) -> Usage:
    """A non-stream answer's usage; reasoning tokens only when a reasoning parser counted them."""
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        completion_tokens_details=None if reasoning is None else CompletionTokensDetails(reasoning_tokens=reasoning),
    )


class ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "streamproxy"
    root: str | None = None
    max_model_len: int | None = None
    object: str = "model"
    # A LoRA adapter's card names the base model it runs on (vLLM's field; null for a base model).
    parent: str | None = None


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"


class HealthStatus(msgspec.Struct):
    """GET /health: "ok" (200) once the engine is ready, else its state, "loading" or "dead" (503)."""

    status: str


class VersionInfo(msgspec.Struct):
    """GET /version."""

    version: str


encode = msgspec.json.Encoder().encode
