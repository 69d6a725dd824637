"""POST /v1/chat/completions: decode -> messages/params -> generation.run."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from .. import params as P
from ..accumulate import Accumulator
from ..errors import InvalidRequest
from ..protocol.common import PromptTokensDetails, Usage
from ..protocol.openai_chat import ChatChoice, ChatCompletion, ResponseMessage, decode_request
from ..state import SYSTEM_FINGERPRINT, app_state
from ..stream import ChatStreamEncoder
from . import generation
from .body import decode_body

_encode = msgspec.json.Encoder().encode


def render_prompt(engine: Any, messages: list[dict[str, Any]], req: Any) -> list[int]:
    try:
        return engine.render_chat(
            messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            chat_template_kwargs=req.chat_template_kwargs,
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidRequest(f"the chat template could not render these messages: {exc}", param="messages") from exc
    except Exception as exc:  # jinja2 TemplateError and friends: the client's messages are the cause
        if type(exc).__module__.startswith("jinja2"):
            raise InvalidRequest(f"the chat template could not render these messages: {exc}", param="messages") from exc
        raise


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = app_state(request)
    req = await decode_body(request, decode_request)
    engine = state.require_engine(req.model)
    if req.tools and req.tool_choice not in (None, "none"):
        raise InvalidRequest(
            "tool calling is not enabled on this server (start it with --enable-auto-tool-choice "
            "--tool-call-parser NAME, or send tool_choice 'none')",
            param="tool_choice",
        )
    if req.response_format is not None and not (isinstance(req.response_format, dict) and req.response_format.get("type") == "text"):
        raise InvalidRequest("response_format other than 'text' is not supported yet", param="response_format")
    messages = P.chat_messages(req.messages)
    prompt_ids = render_prompt(engine, messages, req)
    params = P.sampling_params(
        req,
        prompt_len=len(prompt_ids),
        max_model_len=engine.info.max_model_len,
        requested_max_tokens=P.chat_max_tokens(req),
        max_n=state.settings.max_n,
        logprobs=P.chat_logprobs(req),
    )
    if params.logprobs is not None:
        raise InvalidRequest("logprobs are not supported yet", param="logprobs")
    response_id = "chatcmpl-" + request["request_id"]
    created = int(time.time())
    model = req.model or engine.info.name
    options = req.stream_options

    def encoder() -> ChatStreamEncoder:
        return ChatStreamEncoder(
            response_id=response_id,
            created=created,
            model=model,
            n=params.n,
            include_usage=bool(options and options.include_usage),
            continuous_usage=bool(options and options.continuous_usage_stats),
            system_fingerprint=SYSTEM_FINGERPRINT,
        )

    def render(acc: Accumulator) -> bytes:
        choices = [
            ChatChoice(index=i, message=ResponseMessage(role="assistant", content=acc.text(i)), logprobs=None, finish_reason=acc.finish_reasons[i])
            for i in range(params.n)
        ]
        usage = Usage(
            prompt_tokens=acc.prompt_tokens,
            completion_tokens=acc.completion_tokens,
            total_tokens=acc.prompt_tokens + acc.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=acc.cached_tokens),
        )
        return _encode(ChatCompletion(id=response_id, created=created, model=model, choices=choices, usage=usage, system_fingerprint=SYSTEM_FINGERPRINT))

    return await generation.run(
        request, state, engine, prompt_ids=prompt_ids, params=params, stream=req.stream, encoder=encoder, render=render
    )
