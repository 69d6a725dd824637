"""Request preparation: one chat request -> prompt ids, engine params, filter chain.

Chat, Responses and Anthropic (after `apis/<api>/convert.to_chat`) all come here: tool plan and
structured-output constraint (structured.py), chat template kwargs, the rendered prompt, the sampling
params and the per-choice filter chain, so a feature added here reaches every chat-like API. Errors name
the chat request's parameters; `renamed` puts them in the calling API's words. Sans-IO: the engine is
only asked to render and tokenize.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from engine_adapter.base import Engine, GenerationParams
from streamproxy.config import Settings
from streamproxy.core import params as P
from streamproxy.core import structured as S
from streamproxy.core.chat_template import content_format
from streamproxy.errors import InvalidRequest
from streamproxy.filters.base import FilterFactory
from streamproxy.filters.chain import chat_filters, parser_spec, reasoning_spec
from streamproxy.protocol.openai_chat import ChatCompletionRequest, ChatMessage, TemplateRequest

# A parser name that only lets `tool_plan` pass "auto" when counting tokens.
_COUNTING = "(counting)"


@dataclass(slots=True)
class Prepared:
    prompt_ids: list[int]
    params: GenerationParams
    filters: FilterFactory | None
    forced_call: bool  # tool_choice required or named: the answer is a call, content is null
    window_capped: bool  # max_tokens was lowered to what the context leaves


# vLLM's words for a request that brings its own template to a server that does not trust them.
UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


def template_for(settings: Settings, req: TemplateRequest) -> str | None:
    """The template `req` renders with: its own `chat_template` (only with
    --trust-request-chat-template, else a 400 as in vLLM), else --chat-template, else the model's (None)."""
    kwargs = req.chat_template_kwargs
    own = req.chat_template if req.chat_template is not None else (kwargs or {}).get("chat_template")
    if own is not None:
        if not settings.trust_request_chat_template:
            raise InvalidRequest(UNTRUSTED_TEMPLATE, param="chat_template")
        return str(own)
    return settings.chat_template


def render_prompt(
    settings: Settings,
    engine: Engine,
    messages: list[ChatMessage],
    req: TemplateRequest,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """The chat template's token ids; `template_kwargs` None means the request's own."""
    template = template_for(settings, req)
    kwargs = req.chat_template_kwargs if template_kwargs is None else template_kwargs
    if kwargs and "chat_template" in kwargs:  # the template is chosen above, never through the kwargs
        kwargs = {k: v for k, v in kwargs.items() if k != "chat_template"}
    fmt = content_format(settings.chat_template_content_format, template or engine.info.chat_template)
    dicts = P.chat_messages(messages, fmt)
    try:
        return engine.render_chat(
            dicts,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            tools=tools,
            chat_template_kwargs=kwargs,
            chat_template=template,
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidRequest(f"the chat template could not render these messages: {exc}", param="messages") from exc
    except Exception as exc:  # jinja2 TemplateError and friends: the client's messages are the cause
        if type(exc).__module__.startswith("jinja2"):
            raise InvalidRequest(f"the chat template could not render these messages: {exc}", param="messages") from exc
        raise


# Auto tool choice is on but no parser: `--tool-call-parser auto` found no syntax it knows in the template.
_NO_PARSER = (
    "\"auto\" tool choice is not available for this model: the server's --tool-call-parser auto found no "
    "tool-call syntax it knows in the model's chat template (start it with --tool-call-parser NAME); "
    "send tool_choice \"required\", a named function or \"none\" instead"
)


def prompt(settings: Settings, engine: Engine, req: ChatCompletionRequest, *, counting: bool = False) -> tuple[S.ToolPlan | None, list[int]]:
    """The tool plan and the prompt's token ids, as the chat template renders them.

    `counting`: tokens are only counted (count_tokens), so "auto" needs no parser."""
    auto_parser = settings.tool_call_parser if settings.enable_auto_tool_choice else None
    plan = S.tool_plan(req, auto_parser=auto_parser or (_COUNTING if counting else None), no_parser=_NO_PARSER if settings.enable_auto_tool_choice else None)
    kwargs = P.template_kwargs(req, settings.default_chat_template_kwargs, settings.reasoning_effort_map)
    tools = plan.tools if plan is not None else None
    if tools and settings.exclude_tools_when_tool_choice_none and req.tool_choice == "none":
        tools = None  # --exclude-tools-when-tool-choice-none: the template does not see them (as vLLM)
    ids = render_prompt(settings, engine, req.messages, req, tools, kwargs)
    return plan, ids


def prepare(settings: Settings, engine: Engine, req: ChatCompletionRequest, *, cap_to_context: bool = False) -> Prepared:
    """Prompt, sampling params, structured constraint and filter chain of one request.

    `cap_to_context`: a max_tokens beyond what the context leaves is lowered
    to fit instead of refused (Anthropic clients send large budgets as a cap).
    """
    plan, prompt_ids = prompt(settings, engine, req)
    constraint = S.constraint(req, plan)
    info = engine.info
    requested = P.chat_max_tokens(req)
    room = info.max_model_len - len(prompt_ids)
    capped = cap_to_context and requested is not None and room > 0 and requested > room
    params = P.sampling_params(
        req,
        prompt_len=len(prompt_ids),
        max_model_len=info.max_model_len,
        requested_max_tokens=room if capped else requested,
        max_n=settings.max_n,
        vocab_size=info.vocab_size,
        logprobs=P.chat_logprobs(req),
    )
    params.structured = constraint
    params.prompt_logprobs = P.prompt_logprobs(req)
    kwargs = P.template_kwargs(req, settings.default_chat_template_kwargs, settings.reasoning_effort_map)
    params.template_kwargs = kwargs
    parser = None
    if plan is not None and plan.mode == "auto" and settings.tool_call_parser:
        parser = parser_spec(settings.tool_call_parser, tokenizer=engine.tokenizer, tools=plan.tools)
        if parser.keep_special_tokens:
            params.skip_special_tokens = False  # the parser reads its tags from the text
    reasoning = reasoning_spec(settings.reasoning_parser, tokenizer=engine.tokenizer, template_kwargs=kwargs, prompt_ids=prompt_ids)
    if reasoning is not None and reasoning.keep_special_tokens:
        params.skip_special_tokens = False
    forced = plan is not None and plan.mode in ("required", "named")
    return Prepared(prompt_ids, params, chat_filters(plan, parser, reasoning), forced, capped)


@contextmanager
def renamed(names: list[tuple[str, str]]) -> Iterator[None]:
    """Re-raise the chat path's InvalidRequest with its parameter names translated.

    A name starting with "." is a path fragment (`.function.parameters`); the
    others are top-level parameters (`max_tokens`)."""
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
