"""POST /tokenize and /detokenize (vLLM's shapes): the server's own tokenizer.

A chat tokenize renders the messages through the same chat template as
`/v1/chat/completions`, so its `count` is exactly the `prompt_tokens` a
completion of the same messages is billed.
"""

from __future__ import annotations

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


async def detokenize(request: web.Request) -> web.Response:
    state = app_state(request)
    req = await decode_body(request, decode_detokenize)
    engine = state.require_engine(req.model)
    vocab = engine.info.vocab_size
    for i, t in enumerate(req.tokens):
        if t < 0 or (vocab is not None and t >= vocab):
            raise InvalidRequest(f"token id {t} is outside the vocabulary", param=f"tokens[{i}]")
    return _json(DetokenizeResponse(prompt=engine.decode(req.tokens)))
