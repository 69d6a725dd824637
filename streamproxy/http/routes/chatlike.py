"""The chat route's preparation, for requests of other APIs translated into a chat request.

The Responses and Anthropic routes convert their request into a
`ChatCompletionRequest` (`convert_responses`, `convert_anthropic`); from
there everything is the chat path's own code, composed the way
`routes/chat.py` composes it: `structured.tool_plan` and `constraint`, the
chat template (with the tools and `params.template_kwargs`: server
defaults, the reasoning effort, the request's), `params.sampling_params`,
and `filters.chain.chat_filters` for the per-choice filter chain
(`reasoning_spec` first, then the tool parser). So a feature added to chat
reaches these APIs with no code here.

Errors raised on the way name the chat path's parameters; `renamed` puts
them in the calling API's words (`max_tokens` -> `max_output_tokens`,
`tools[0].function.parameters` -> `tools[0].input_schema`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from engine_adapter.base import Engine, GenerationParams
from streamproxy.core import params as P
from streamproxy.core import structured as S
from streamproxy.errors import InvalidRequest
from streamproxy.filters.base import FilterFactory
from streamproxy.filters.chain import chat_filters, parser_spec, reasoning_spec
from streamproxy.http.routes.chat import render_prompt
from streamproxy.http.state import AppState
from streamproxy.protocol.openai_chat import ChatCompletionRequest

# A parser name that only lets `tool_plan` pass "auto" when counting tokens.
_COUNTING = "(counting)"


class Prepared:
    __slots__ = ("prompt_ids", "params", "filters", "window_capped")

    def __init__(self, prompt_ids: list[int], params: GenerationParams, filters: FilterFactory | None, window_capped: bool) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        self.filters = filters
        self.window_capped = window_capped  # max_tokens was lowered to what the context leaves


@contextmanager
def renamed(names: list[tuple[str, str]]) -> Iterator[None]:
    """Re-raise the chat path's InvalidRequest with its parameter names translated."""
    try:
        yield
    except InvalidRequest as exc:
        exc.param = _rename(exc.param, names) if exc.param else exc.param
        message = exc.message
        for chat, api in names:
            if not chat.startswith("."):
                message = message.replace(f"'{chat}'", f"'{api}'").replace(f" {chat}.", f" {api}.")
        exc.message = message
        exc.args = (message,)
        raise


def _rename(param: str, names: list[tuple[str, str]]) -> str:
    for chat, api in names:
        if chat.startswith("."):
            param = param.replace(chat, api)
        elif param == chat or param.startswith((chat + ".", chat + "[")):
            param = api + param[len(chat) :]
    return param


def prompt(state: AppState, engine: Engine, req: ChatCompletionRequest, *, counting: bool = False) -> tuple[Any, list[int]]:
    """The tool plan and the prompt's token ids, as the chat template renders them."""
    settings = state.settings
    auto_parser = settings.tool_call_parser if settings.enable_auto_tool_choice else None
    plan = S.tool_plan(req, auto_parser=auto_parser or (_COUNTING if counting else None))
    kwargs = P.template_kwargs(req, settings.default_chat_template_kwargs)
    ids = render_prompt(engine, P.chat_messages(req.messages), req, plan.tools if plan is not None else None, kwargs)
    return plan, ids


def prepare(state: AppState, engine: Engine, req: ChatCompletionRequest, *, cap_to_context: bool = False) -> Prepared:
    """Prompt, sampling params, structured constraint and filter chain of one request.

    `cap_to_context`: a max_tokens beyond what the context leaves is lowered
    to fit instead of refused (Anthropic clients send large budgets as a cap).
    """
    plan, prompt_ids = prompt(state, engine, req)
    constraint = S.constraint(req, plan)
    max_model_len = engine.info.max_model_len
    requested = P.chat_max_tokens(req)
    room = max_model_len - len(prompt_ids)
    capped = cap_to_context and requested is not None and room > 0 and requested > room
    params = P.sampling_params(
        req,
        prompt_len=len(prompt_ids),
        max_model_len=max_model_len,
        requested_max_tokens=room if capped else requested,
        max_n=state.settings.max_n,
    )
    params.structured = constraint
    parser = None
    if plan is not None and plan.mode == "auto":
        parser = parser_spec(state.settings.tool_call_parser, tokenizer=getattr(engine, "tokenizer", None), tools=plan.tools)  # type: ignore[arg-type]
        if parser.keep_special_tokens:
            params.skip_special_tokens = False  # the parser reads its tags from the text
    kwargs = P.template_kwargs(req, state.settings.default_chat_template_kwargs)
    params.template_kwargs = kwargs
    reasoning = reasoning_spec(state.settings.reasoning_parser, tokenizer=getattr(engine, "tokenizer", None), template_kwargs=kwargs)
    if reasoning is not None and reasoning.keep_special_tokens:
        params.skip_special_tokens = False
    return Prepared(prompt_ids, params, chat_filters(plan, parser, reasoning), capped)
