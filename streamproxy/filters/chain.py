"""Which filters a chat request's choices run, built once per request.

`chat_filters(plan, parser)` returns a factory of one fresh chain per choice, or None when no filter is
needed (the encoders' plain fast path). The chain: a reasoning splitter (with --reasoning-parser and a
thinking request), then at most one tool-call filter: `NamedToolEmitter` ("named"),
`RequiredToolEmitter` ("required"), the server's --tool-call-parser ("auto"). `reasoning_spec` and
`parser_spec` resolve the flags by `registry`'s rules: ours by name first, then an engine's
(`vllm:NAME` forces vLLM's); qwen3 with `enable_thinking: false` needs no splitter.
"""

from __future__ import annotations

from typing import Any

from streamproxy.filters.base import FilterFactory
from streamproxy.filters.constrained import NamedToolEmitter, RequiredToolEmitter
from streamproxy.filters.reasoning import OWN_REASONING
from streamproxy.filters.registry import REASONING_PARSERS, TOOL_PARSERS, Registry, Source
from streamproxy.filters.toolset import ToolSet

OWN_PARSERS = TOOL_PARSERS.own


def known_parser(name: str) -> bool:
    return TOOL_PARSERS.known(name)


def known_reasoning_parser(name: str) -> bool:
    return REASONING_PARSERS.known(name)


def _theirs(registry: Registry, what: str, name: str) -> tuple[Source, str]:
    found = registry.source(name)
    if found is None:
        raise ValueError(f"unknown {what} {name!r} ({registry.choices()})")
    return found


def parser_spec(name: str, *, tokenizer: Any, tools: list[dict[str, Any]]) -> Any:
    """A parser factory `spec(toolset, parallel=...)` with `.keep_special_tokens`."""
    own = OWN_PARSERS.get(name)
    if own is not None:
        return own
    source, bare = _theirs(TOOL_PARSERS, "tool-call parser", name)
    return source.make(bare, tokenizer, tools)


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
    source, bare = _theirs(REASONING_PARSERS, "reasoning parser", name)
    return source.make(bare, tokenizer, template_kwargs, prompt_ids)


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
