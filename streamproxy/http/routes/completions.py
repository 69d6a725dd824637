"""POST /v1/completions: the legacy text endpoint (`vllm bench serve`'s default).

`core.completion.plan` makes a `generation.Work` of one engine request per prompt (ids `-<i>` in a
batch); a batch or echo is merged into one stream of prompts x n choices, usage summed. `logprobs: N`
gives the legacy shape (logprobs.py); `response_format` and vLLM's structured fields constrain as on
chat; vLLM's `prompt_logprobs` (non-stream) ride on each choice.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
from aiohttp import web

from engine_adapter.base import TokenLogprob
from streamproxy.config import Settings
from streamproxy.core import completion as C
from streamproxy.core import continuation
from streamproxy.core.accumulate import ChoiceAccumulator
from streamproxy.core.logprobs import CompletionLogprobs, vllm_prompt_logprobs
from streamproxy.core.stream import CompletionStreamEncoder
from streamproxy.errors import InvalidRequest
from streamproxy.http.context import CONTEXT
from streamproxy.http.routes import generation
from streamproxy.http.routes.body import decode_body
from streamproxy.http.state import SYSTEM_FINGERPRINT, app_state
from streamproxy.protocol.common import usage
from streamproxy.protocol.openai_completions import Completion, CompletionChoice, CompletionRequest, decode_request

_encode = msgspec.json.Encoder().encode


async def completions(request: web.Request) -> web.StreamResponse:
    # Planned in a plain function, as chat's: this frame lives as long as the stream.
    return await generation.run(request, *_plan(request, await decode_body(request, decode_request)))


def _plan(request: web.Request, req: CompletionRequest) -> tuple[generation.Work, generation.Answer[ChoiceAccumulator], bool]:
    state = app_state(request)
    engine = state.require_engine(req.model)
    plan = C.plan(engine, req, max_n=state.settings.max_n)
    adapter = state.adapter(req.model)
    for params in plan.params:
        params.adapter = adapter
    limit = state.settings.max_concurrent_requests
    if limit > 0 and len(plan.prompts) > limit:
        raise InvalidRequest(
            f"'prompt' holds {len(plan.prompts)} prompts, but this server generates at most {limit} at once "
            "(--max-concurrent-requests); send fewer per request",
            param="prompt",
        )
    out = _Output(req, engine.info.name, request[CONTEXT].request_id, plan, state.settings)
    echo = None if plan.texts is None else [plan.echo(i) for i in range(len(plan.prompts))]
    prompts, ids = plan.prompts, req.continue_token_ids
    if ids is not None:
        continuation.check(ids, plan.params[0], stream=out.stream, vocab_size=engine.info.vocab_size,
                           several=len(prompts) > 1, echo=bool(req.echo))
        out.pieces = continuation.pieces(engine.decode, prompts[0], ids)
        prompts = [continuation.apply(prompts[0], plan.params[0], ids)]
    work = generation.Work(engine, prompts, plan.params, plan.n, echo, continued=len(ids or ()))
    out.prompt_logprobs_of = work.prompt_logprobs
    return work, generation.Answer(out.encoder, out.accumulator, out.render, generation.headers_for(req)), out.stream


def _none(i: int) -> None:
    return None


class _Output:
    """What shapes one request's answer: the stream encoder, or the accumulator and JSON body."""

    __slots__ = (
        "response_id", "created", "model", "n", "choices", "stream", "include_usage", "continuous_usage", "logprobs",
        "prompt_logprobs", "prompt_logprobs_of", "token_ids", "prompt_ids", "pieces",
    )

    def __init__(self, req: CompletionRequest, served: str, request_id: str, plan: C.CompletionPlan, settings: Settings) -> None:
        self.response_id = "cmpl-" + request_id
        self.created = int(time.time())
        self.model = req.model or served
        self.n = plan.n
        self.choices = plan.choices
        self.stream = bool(req.stream)
        options = req.stream_options
        # --enable-force-include-usage: a usage chunk whether asked for or not (as vLLM).
        self.include_usage = settings.enable_force_include_usage or bool(options and options.include_usage)
        self.continuous_usage = bool(options and options.continuous_usage_stats)
        self.logprobs = plan.logprobs
        self.token_ids = settings.return_tokens_as_token_ids
        self.prompt_logprobs = plan.prompt_logprobs
        # Prompt number -> its prompt logprobs, from the work (set by the handler).
        self.prompt_logprobs_of: Callable[[int], list[TokenLogprob] | None] = _none
        # return_token_ids: each choice's prompt ids (prompt number x n + choice); continue_token_ids: the earlier tokens.
        self.prompt_ids = [p for p in plan.prompts for _ in range(plan.n)] if req.return_token_ids else None
        self.pieces: list[tuple[str, int]] | None = None

    def encoder(self) -> CompletionStreamEncoder:
        enc = CompletionStreamEncoder(
            response_id=self.response_id,
            created=self.created,
            model=self.model,
            n=self.choices,
            include_usage=self.include_usage,
            continuous_usage=self.continuous_usage,
            system_fingerprint=SYSTEM_FINGERPRINT,
            logprobs=self.logprobs,
            return_ids=self.prompt_ids is not None,
            prompt_ids=self.prompt_ids,
        )
        enc.token_ids = self.token_ids
        if self.pieces is not None:
            enc.prime(self.pieces)
        return enc

    def accumulator(self) -> ChoiceAccumulator:
        return ChoiceAccumulator(self.choices, logprobs=self.logprobs, ids=self.prompt_ids is not None)

    def render(self, acc: ChoiceAccumulator) -> bytes:
        choices = []
        for i in range(self.choices):
            tokens = acc.logprobs(i)
            choice = CompletionChoice(
                index=i,
                text=acc.text(i),
                logprobs=None if tokens is None else CompletionLogprobs(self.token_ids).add(tokens),
                finish_reason=acc.finish_reasons[i],
            )
            if self.prompt_logprobs:
                prompt = self.prompt_logprobs_of(i // self.n)
                choice.prompt_logprobs = None if prompt is None else vllm_prompt_logprobs(prompt)
            if acc.ids is not None and self.prompt_ids is not None:
                choice.token_ids, choice.prompt_token_ids = acc.ids[i], list(self.prompt_ids[i])
            choices.append(choice)
        used = usage(acc.prompt_tokens, acc.completion_tokens, acc.cached_tokens)
        return _encode(
            Completion(
                id=self.response_id, created=self.created, model=self.model, choices=choices, usage=used, system_fingerprint=SYSTEM_FINGERPRINT
            )
        )
