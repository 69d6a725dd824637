"""Wire schema of vLLM's `/tokenize` and `/detokenize` (also under `/v1/`)."""

from __future__ import annotations

from typing import Any

import msgspec

from streamproxy.protocol.openai_chat import ChatMessage


class TokenizeRequest(msgspec.Struct):
    model: str | None = None
    # Either a completion prompt ...
    prompt: str | None = None
    add_special_tokens: bool = True
    # ... or chat messages rendered through the chat template.
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    tools: list[Any] | None = None
    return_token_strs: bool = False


class TokenizeResponse(msgspec.Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct):
    tokens: list[int]
    model: str | None = None


class DetokenizeResponse(msgspec.Struct):
    prompt: str


decode_tokenize = msgspec.json.Decoder(TokenizeRequest).decode
decode_detokenize = msgspec.json.Decoder(DetokenizeRequest).decode
