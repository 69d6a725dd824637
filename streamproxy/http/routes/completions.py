"""POST /v1/completions: the legacy text endpoint (`vllm bench serve`'s default).

`logprobs: N` gives the legacy logprobs shape (see `logprobs.py`);
`response_format` and vLLM's structured-output fields constrain the text
as on chat (`structured.constraint`).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from streamproxy.core import params as P
from streamproxy.core import structured as S
from streamproxy.core.accumulate import ChoiceAccumulator
from streamproxy.core.logprobs import CompletionLogprobs
from streamproxy.core.stream import CompletionStreamEncoder
from streamproxy.errors import InvalidRequest
from streamproxy.http.routes import generation
from streamproxy.http.routes.body import decode_body
from streamproxy.http.state import SYSTEM_FINGERPRINT, app_state
from streamproxy.protocol.common import usage
from streamproxy.protocol.openai_completions import Completion, CompletionChoice, decode_request

_encode = msgspec.json.Encoder().encode


async def completions(request: web.Request) -> web.StreamResponse:
    state = app_state(request)
    req = await decode_body(request, decode_request)
    engine = state.require_engine(req.model)
    prompts = P.completion_prompts(req.prompt)
    if len(prompts) != 1:
        raise InvalidRequest("send one prompt per request (batched prompts are not supported)", param="prompt")
    if req.echo or req.suffix:
        raise InvalidRequest("'echo' and 'suffix' are not supported", param="echo" if req.echo else "suffix")
    if req.best_of is not None and req.best_of != P.choices(req):
        raise InvalidRequest("'best_of' is not supported", param="best_of")
    prompt = prompts[0]
    if isinstance(prompt, str):
        prompt_ids = engine.encode(prompt)
    else:
        prompt_ids = list(prompt)
        vocab = engine.info.vocab_size
        if any(t < 0 or (vocab is not None and t >= vocab) for t in prompt_ids):
            raise InvalidRequest("prompt token ids must be within the vocabulary", param="prompt")
    if not prompt_ids:
        raise InvalidRequest("the prompt is empty", param="prompt")
    params = P.sampling_params(
        req,
        prompt_len=len(prompt_ids),
        max_model_len=engine.info.max_model_len,
        requested_max_tokens=req.max_tokens,
        max_n=state.settings.max_n,
        vocab_size=engine.info.vocab_size,
        logprobs=P.completion_logprobs(req),
    )
    params.structured = S.constraint(req)
    want_logprobs = params.logprobs is not None
    response_id = "cmpl-" + request["request_id"]
    created = int(time.time())
    model = req.model or engine.info.name
    options = req.stream_options

    def encoder() -> CompletionStreamEncoder:
        return CompletionStreamEncoder(
            response_id=response_id,
            created=created,
            model=model,
            n=params.n,
            include_usage=bool(options and options.include_usage),
            continuous_usage=bool(options and options.continuous_usage_stats),
            system_fingerprint=SYSTEM_FINGERPRINT,
            logprobs=want_logprobs,
        )

    def accumulator() -> ChoiceAccumulator:
        return ChoiceAccumulator(params.n, logprobs=want_logprobs)

    def logprobs(acc: ChoiceAccumulator, i: int) -> Any:
        tokens = acc.logprobs(i)
        return None if tokens is None else CompletionLogprobs().add(tokens)

    def render(acc: ChoiceAccumulator) -> bytes:
        choices = [
            CompletionChoice(index=i, text=acc.text(i), logprobs=logprobs(acc, i), finish_reason=acc.finish_reasons[i])
            for i in range(params.n)
        ]
        used = usage(acc.prompt_tokens, acc.completion_tokens, acc.cached_tokens)
        return _encode(Completion(id=response_id, created=created, model=model, choices=choices, usage=used, system_fingerprint=SYSTEM_FINGERPRINT))

    return await generation.run(
        request,
        state,
        engine,
        prompt_ids=prompt_ids,
        params=params,
        stream=bool(req.stream),
        encoder=encoder,
        render=render,
        accumulator=accumulator,
    )
