"""POST /v1/embeddings: one engine pooling request per input, OpenAI's response shape.

Only for a model served with vLLM's pooling runner (an embedding model); a
generative model answers 400. `encoding_format: "base64"` is the
little-endian float32 bytes of each vector, base64-encoded, as OpenAI's SDKs
expect. All inputs run at once (the engine batches them); if the client
leaves, every one still running is aborted.
"""

from __future__ import annotations

import asyncio
import base64
import struct

from aiohttp import web

from engine_adapter.base import EngineFailure, EngineRejected
from streamproxy.core import params as P
from streamproxy.errors import ContextLengthExceeded, InvalidRequest, ServiceUnavailable
from streamproxy.http.context import CONTEXT
from streamproxy.http.routes.body import decode_body
from streamproxy.http.state import app_state
from streamproxy.protocol.embeddings import Embedding, EmbeddingList, EmbeddingUsage, decode_request, encode


def _b64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


async def embeddings(request: web.Request) -> web.Response:
    state = app_state(request)
    req = await decode_body(request, decode_request)
    engine = state.require_engine(req.model, adapters=False)
    if engine.info.runner != "pooling":
        raise InvalidRequest(
            f"the served model '{engine.info.name}' is a generative model and cannot make embeddings; "
            "serve an embedding model (vLLM's pooling runner) for /v1/embeddings",
            param="model",
            code="model_not_supported",
        )
    if req.encoding_format not in ("float", "base64"):
        raise InvalidRequest("'encoding_format' must be 'float' or 'base64'", param="encoding_format")
    if req.dimensions is not None and req.dimensions < 1:
        raise InvalidRequest("'dimensions' must be at least 1", param="dimensions")
    try:
        inputs = P.completion_prompts(req.input)
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message.replace("'prompt'", "'input'"), param="input") from None
    prompts = [engine.encode(x) if isinstance(x, str) else list(x) for x in inputs]
    limit = engine.info.max_model_len
    vocab = engine.info.vocab_size
    for i, ids in enumerate(prompts):
        where = f"input[{i}]" if len(prompts) > 1 else "input"
        if not ids:
            raise InvalidRequest("an input is empty", param=where)
        if not isinstance(inputs[i], str) and any(t < 0 or (vocab is not None and t >= vocab) for t in ids):
            raise InvalidRequest("input token ids must be within the vocabulary", param=where)
        if len(ids) > limit:
            raise ContextLengthExceeded(
                f"input {i} has {len(ids)} tokens, more than the model's maximum of {limit}", param="input"
            )
    rid = request[CONTEXT].request_id
    ids_for = [f"{rid}-{i}" for i in range(len(prompts))]
    tasks = [asyncio.ensure_future(engine.embed(ids_for[i], p, req.dimensions)) for i, p in enumerate(prompts)]
    try:
        vectors = await asyncio.gather(*tasks)
    except EngineRejected as exc:
        raise InvalidRequest(str(exc), param=exc.param) from exc
    except EngineFailure as exc:
        raise ServiceUnavailable(str(exc)) from exc
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
    data = [
        Embedding(index=i, embedding=_b64(v) if req.encoding_format == "base64" else v) for i, v in enumerate(vectors)
    ]
    tokens = sum(len(p) for p in prompts)
    body = EmbeddingList(data=data, model=req.model or engine.info.name, usage=EmbeddingUsage(tokens, tokens))
    return web.Response(body=encode(body), content_type="application/json")
