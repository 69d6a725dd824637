"""POST /v1/chat/completions: decode -> plan (core.prepare) -> generation.run.

`core.prepare` builds prompt, params and the per-choice filter chain; the
same chain runs in the stream encoder and in the non-stream accumulator, so
both answers agree. The thinking goes out as `reasoning`, and as
`reasoning_content` too unless --no-reasoning-content-field. vLLM's
`prompt_logprobs` (non-stream) are read from the engine request's stream
and sent beside the choices, in vLLM's shape.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from streamproxy.core import continuation
from streamproxy.core.accumulate import ChoiceAccumulator
from streamproxy.core.logprobs import chat_choice_logprobs, chat_entries, vllm_prompt_logprobs
from streamproxy.core.prepare import prepare
from streamproxy.core.stream import ChatStreamEncoder
from streamproxy.http.context import CONTEXT
from streamproxy.http.routes import generation
from streamproxy.http.routes.body import decode_body
from streamproxy.http.state import SYSTEM_FINGERPRINT, app_state
from streamproxy.protocol.common import usage
from streamproxy.protocol.openai_chat import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    FunctionCall,
    ResponseMessage,
    ResponseToolCall,
    decode_request,
)

_encode = msgspec.json.Encoder().encode


def _message(acc: ChoiceAccumulator, i: int, reasoning_content: bool, role: str) -> ResponseMessage:
    calls = acc.tool_calls(i)
    text = acc.text(i)
    thinking = acc.reasoning(i)
    return ResponseMessage(
        role=role,
        # Only tool calls: content is null, as OpenAI sends it.
        content=(text or None) if calls else text,
        refusal=None,
        tool_calls=[ResponseToolCall(id=cid, function=FunctionCall(name=name, arguments=args)) for cid, name, args in calls],
        reasoning=thinking,
        reasoning_content=thinking if reasoning_content else None,
    )


async def chat_completions(request: web.Request) -> web.StreamResponse:
    # Everything is planned in a plain function and handed straight to generation.run: this
    # coroutine's frame lives as long as the stream, and so keeps neither the decoded body, its
    # messages, nor the prompt's ids.
    return await generation.run(request, *_plan(request, await decode_body(request, decode_request)))


def _plan(request: web.Request, req: ChatCompletionRequest) -> tuple[generation.Work, generation.Answer[ChoiceAccumulator], bool]:
    """The engine request and the answer of one decoded chat request."""
    state = app_state(request)
    engine = state.require_engine(req.model)
    prep = prepare(state.settings, engine, req)
    prep.params.adapter = state.adapter(req.model)
    options = req.stream_options
    ids, pieces, engine_prompt = req.continue_token_ids, None, prep.prompt_ids
    if ids is not None:
        continuation.check(ids, prep.params, stream=bool(req.stream), vocab_size=engine.info.vocab_size)
        pieces = continuation.pieces(engine.decode, prep.prompt_ids, ids)
        engine_prompt = continuation.apply(prep.prompt_ids, prep.params, ids)
    work = generation.Work(engine, [engine_prompt], [prep.params], continued=len(ids or ()))
    out = _ChatOutput(
        response_id="chatcmpl-" + request[CONTEXT].request_id,
        created=int(time.time()),
        model=req.model or engine.info.name,
        n=prep.params.n,
        # --enable-force-include-usage: a usage chunk whether asked for or not (as vLLM).
        include_usage=state.settings.enable_force_include_usage or bool(options and options.include_usage),
        continuous_usage=bool(options and options.continuous_usage_stats),
        filters=prep.filters,
        logprobs=prep.params.logprobs is not None,
        forced_call=prep.forced_call,
        reasoning_content=state.settings.reasoning_content_field,
        work=work if prep.params.prompt_logprobs is not None else None,
        # vLLM's rule: --response-role when the template adds the generation prompt, else the last message's role.
        role=state.settings.response_role if req.add_generation_prompt else req.messages[-1].role,
        token_ids=state.settings.return_tokens_as_token_ids,
        prompt_ids=prep.prompt_ids if req.return_token_ids else None,
        pieces=pieces,
    )
    return work, generation.Answer(out.encoder, out.accumulator, out.render, generation.headers_for(req)), bool(req.stream)


@dataclass(slots=True, kw_only=True)
class _ChatOutput:
    """What shapes one request's answer (stream encoder, or accumulator + JSON body).

    One small object instead of closures over the handler's locals: it is
    kept for the whole stream, the request body and prompt are not.
    """

    response_id: str
    created: int
    model: str
    n: int
    include_usage: bool
    continuous_usage: bool
    filters: Any
    logprobs: bool
    forced_call: bool
    reasoning_content: bool
    work: generation.Work | None  # when the prompt's logprobs were asked for: where they come from
    role: str
    token_ids: bool  # --return-tokens-as-token-ids
    prompt_ids: list[int] | None  # return_token_ids: the prompt's (else None)
    pieces: list[tuple[str, int]] | None  # continue_token_ids: the earlier tokens (text, id)

    def encoder(self) -> ChatStreamEncoder:
        enc = ChatStreamEncoder(
            response_id=self.response_id,
            created=self.created,
            model=self.model,
            n=self.n,
            include_usage=self.include_usage,
            continuous_usage=self.continuous_usage,
            system_fingerprint=SYSTEM_FINGERPRINT,
            filters=self.filters,
            logprobs=self.logprobs,
            return_ids=self.prompt_ids is not None,
            prompt_ids=None if self.prompt_ids is None else [self.prompt_ids],
        )
        if self.pieces is not None:
            enc.prime(self.pieces)
        if self.forced_call:
            enc.role_content = b"null"
        enc.reasoning_content = self.reasoning_content
        enc.role = _encode(self.role)
        enc.token_ids = self.token_ids
        return enc

    def accumulator(self) -> ChoiceAccumulator:
        return ChoiceAccumulator(self.n, self.filters, self.logprobs, ids=self.prompt_ids is not None)

    def render(self, acc: ChoiceAccumulator) -> bytes:
        choices = []
        for i in range(self.n):
            lp = acc.logprobs(i)
            logprobs = chat_choice_logprobs(chat_entries(lp, self.token_ids)) if lp is not None else None
            choice = ChatChoice(index=i, message=_message(acc, i, self.reasoning_content, self.role), logprobs=logprobs,
                                finish_reason=acc.finish_reasons[i])
            if acc.ids is not None:
                choice.token_ids = acc.ids[i]
            choices.append(choice)
        used = usage(acc.prompt_tokens, acc.completion_tokens, acc.cached_tokens, acc.reasoning_tokens)
        answer = ChatCompletion(
            id=self.response_id, created=self.created, model=self.model, choices=choices, usage=used, system_fingerprint=SYSTEM_FINGERPRINT
        )
        if self.work is not None:
            prompt = self.work.prompt_logprobs()
            answer.prompt_logprobs = None if prompt is None else vllm_prompt_logprobs(prompt)
        if self.prompt_ids is not None:
            answer.prompt_token_ids = self.prompt_ids
        return _encode(answer)
