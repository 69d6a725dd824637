"""Wire schema of `/v1/embeddings` (OpenAI's shape)."""

from __future__ import annotations

import msgspec

from streamproxy.protocol.common import encode as encode  # noqa: F401  (re-export for the route)


class EmbeddingRequest(msgspec.Struct):
    # str | list[str] | list[int] | list[list[int]], as completions' `prompt` (one array
    # type per union in msgspec: the mix is checked in params.completion_prompts).
    input: str | list[str | int | list[int]]
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


class Embedding(msgspec.Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


decode_request = msgspec.json.Decoder(EmbeddingRequest).decode
