"""Which filters a chat request's choices run, built once per request.

`chat_filters(plan, parser)` returns a factory that makes one fresh chain
per choice (so n > 1 keeps every choice's parse state apart), or None when
the request needs no filter at all, which keeps the encoders on their
plain-content fast path. The chain is a reasoning splitter (when the
server has --reasoning-parser and the request thinks), then at most one
tool-call filter, which so sees only the answer, never the thinking:

    tool_choice "none"/no tools   no filter
    "named"                       NamedToolEmitter (constrained JSON -> one call)
    "required"                    RequiredToolEmitter (constrained JSON array -> calls)
    "auto"                        the server's --tool-call-parser

`reasoning_spec(name, ...)` resolves --reasoning-parser the same way:
ours (`reasoning.OWN_REASONING`: qwen3, deepseek_r1) by name first, then
vLLM's registry (`engine_adapter.vllm_reasoning_parsers`), `vllm:NAME` for vLLM's even where we
have our own. It reads the request's chat template kwargs: qwen3 with
`enable_thinking: false` needs no splitter at all.

`parser_spec(name, ...)` resolves --tool-call-parser: our own sans-IO parsers
by name first (OWN_PARSERS), then any name in vLLM's registry through the
adapter in `engine_adapter.vllm_tool_parsers` (which needs the engine's tokenizer); `vllm:NAME`
takes vLLM's parser even where we have our own.
"""

from __future__ import annotations

from typing import Any

from streamproxy.filters.base import FilterFactory
from streamproxy.filters.constrained import NamedToolEmitter, RequiredToolEmitter
from streamproxy.filters.detect import AUTO
from streamproxy.filters.hermes import HermesParser
from streamproxy.filters.llama3_json import Llama3JsonParser
from streamproxy.filters.mistral import MistralParser
from streamproxy.filters.pythonic import PythonicParser
from streamproxy.filters.reasoning import OWN_REASONING
from streamproxy.filters.toolset import ToolSet

OWN_PARSERS: dict[str, Any] = {
    "hermes": HermesParser,
    "qwen3_json": HermesParser,
    "llama3_json": Llama3JsonParser,
    "llama4_json": Llama3JsonParser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
}

VLLM_PREFIX = "vllm:"


def known_parser(name: str, *, vllm_available: bool) -> bool:
    if name in OWN_PARSERS or name == AUTO:
        return True
    if not vllm_available:
        return False
    from engine_adapter.vllm_tool_parsers import registered

    return registered(name.removeprefix(VLLM_PREFIX))


def parser_spec(name: str, *, tokenizer: Any, tools: list[dict[str, Any]]) -> Any:
    """A parser factory `spec(toolset, parallel=...)` with `.keep_special_tokens`."""
    own = OWN_PARSERS.get(name)
    if own is not None:
        return own
    from engine_adapter.vllm_tool_parsers import VllmParserSpec

    return VllmParserSpec(name.removeprefix(VLLM_PREFIX), tokenizer, tools)


def known_reasoning_parser(name: str, *, vllm_available: bool) -> bool:
    if name in OWN_REASONING or name == AUTO:
        return True
    if not vllm_available:
        return False
    from engine_adapter.vllm_reasoning_parsers import registered

    return registered(name.removeprefix(VLLM_PREFIX))


class _OwnReasoning:
    """Our splitter factory, with what the route asks of it."""

    keep_special_tokens = False

    def __init__(self, make: Any) -> None:
        self.make = make

    def __call__(self) -> Any:
        return self.make()


def reasoning_spec(name: str | None, *, tokenizer: Any, template_kwargs: dict[str, Any],
                   prompt_ids: list[int] | None = None) -> Any:
    """A factory of one reasoning filter per choice, with `.keep_special_tokens`; None: no splitting.
    vLLM's parsers see the rendered prompt (`prompt_ids`) before the answer, as in `vllm serve`."""
    if not name:
        return None
    own = OWN_REASONING.get(name)
    if own is not None:
        make = own(template_kwargs)
        return None if make is None else _OwnReasoning(make)
    from engine_adapter.vllm_reasoning_parsers import VllmReasoningSpec

    return VllmReasoningSpec(name.removeprefix(VLLM_PREFIX), tokenizer, template_kwargs, prompt_ids)


def chat_filters(plan: Any, parser: Any = None, reasoning: Any = None) -> FilterFactory | None:
    tools = _tool_filters(plan, parser)
    if reasoning is None:
        return tools
    if tools is None:
        return lambda: [reasoning()]
    return lambda: [reasoning(), *tools()]


def _tool_filters(plan: Any, parser: Any) -> FilterFactory | None:
    if plan is None or plan.mode == "none":
        return None
    if plan.mode == "named":
        name = plan.name
        return lambda: [NamedToolEmitter(name)]
    if plan.mode == "required":
        return lambda: [RequiredToolEmitter()]
    tools = ToolSet(plan.schemas)
    parallel = plan.parallel
    return lambda: [parser(tools, parallel=parallel)]
