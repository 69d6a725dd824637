"""POST /tokenize and /detokenize (vLLM's shapes): the server's own tokenizer; and
GET /tokenizer_info with --enable-tokenizer-info-endpoint (vLLM's: the tokenizer's
configuration without file paths, its class, and --chat-template when given).

A chat tokenize renders the messages through the same chat template as
`/v1/chat/completions`, so its `count` is exactly the `prompt_tokens` a
completion of the same messages is billed.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from streamproxy.core.prepare import render_prompt
from streamproxy.errors import InvalidRequest
from streamproxy.http.routes.body import decode_body
from streamproxy.http.state import app_state
from streamproxy.protocol.common import encode
from streamproxy.protocol.tokenize import DetokenizeResponse, TokenizeResponse, decode_detokenize, decode_tokenize


def _json(obj: object) -> web.Response:
    return web.Response(body=encode(obj), content_type="application/json")


async def tokenize(request: web.Request) -> web.Response:
    state = app_state(request)
    req = await decode_body(request, decode_tokenize)
    engine = state.require_engine(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise InvalidRequest("send exactly one of 'prompt' or 'messages'", param="prompt")
    if req.messages is not None:
        ids = render_prompt(state.settings, engine, req.messages, req)
    else:
        ids = engine.encode(req.prompt or "", add_special_tokens=req.add_special_tokens)
    strs = [engine.decode([t]) for t in ids] if req.return_token_strs else None
    return _json(TokenizeResponse(count=len(ids), max_model_len=engine.info.max_model_len, tokens=ids, token_strs=strs))


async def tokenizer_info(request: web.Request) -> web.Response:
    state = app_state(request)
    tokenizer = state.require_engine(None).tokenizer
    config = {k: _plain(v) for k, v in (getattr(tokenizer, "init_kwargs", None) or {}).items()
              if k not in ("vocab_file", "merges_file")}
    config["tokenizer_class"] = type(tokenizer).__name__ if tokenizer is not None else "none"
    if state.settings.chat_template:
        config["chat_template"] = state.settings.chat_template
    return web.Response(body=msgspec.json.encode(config), content_type="application/json")


def _plain(value: Any) -> Any:
    """A tokenizer config value as JSON (vLLM's rule: an object with `content`, e.g. AddedToken, is its content)."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


async def detokenize(request: web.Request) -> web.Response:
    state = app_state(request)
    req = await decode_body(request, decode_detokenize)
    engine = state.require_engine(req.model)
    vocab = engine.info.vocab_size
    for i, t in enumerate(req.tokens):
        if t < 0 or (vocab is not None and t >= vocab):
            raise InvalidRequest(f"token id {t} is outside the vocabulary", param=f"tokens[{i}]")
    return _json(DetokenizeResponse(prompt=engine.decode(req.tokens)))
