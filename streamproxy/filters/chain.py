"""Which filters a chat request's choices run, built once per request.

`chat_filters(plan, parser)` returns a factory that makes one fresh chain
per choice (so n > 1 keeps every choice's parse state apart), or None when
the request needs no filter at all, which keeps the encoders on their
plain-content fast path. Today the chain is at most one tool-call filter:

    tool_choice "none"/no tools   no filter
    "named"                       NamedToolEmitter (constrained JSON -> one call)
    "required"                    RequiredToolEmitter (constrained JSON array -> calls)
    "auto"                        the server's --tool-call-parser

A reasoning splitter will go in front of the tool filter here.

`parser_spec(name, ...)` resolves --tool-call-parser: our own sans-IO parsers
by name first (OWN_PARSERS), then any name in vLLM's registry through the
adapter in `vllm_tools` (which needs the engine's tokenizer); `vllm:NAME`
takes vLLM's parser even where we have our own.
"""

from __future__ import annotations

from typing import Any

from .base import FilterFactory
from .constrained import NamedToolEmitter, RequiredToolEmitter
from .hermes import HermesParser
from .llama3_json import Llama3JsonParser
from .mistral import MistralParser
from .pythonic import PythonicParser
from .toolset import ToolSet

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
    if name in OWN_PARSERS:
        return True
    if not vllm_available:
        return False
    from .vllm_tools import registered

    return registered(name.removeprefix(VLLM_PREFIX))


def parser_spec(name: str, *, tokenizer: Any, tools: list[dict[str, Any]]) -> Any:
    """A parser factory `spec(toolset, parallel=...)` with `.keep_special_tokens`."""
    own = OWN_PARSERS.get(name)
    if own is not None:
        return own
    from .vllm_tools import VllmParserSpec

    return VllmParserSpec(name.removeprefix(VLLM_PREFIX), tokenizer, tools)


def chat_filters(plan: Any, parser: Any = None) -> FilterFactory | None:
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
