"""The rest of vLLM's tool-parser registry, behind the filter protocol.

`--tool-call-parser NAME` for a NAME that is not one of ours (see
`filters.registry`, which `SOURCE` joins) resolves here: vLLM's `ToolParserManager` (imported on
first use, only in this module) supplies the parser class, and
`VllmToolCallFilter` drives one instance per choice. vLLM's parsers take
pydantic requests and the engine's tokenizer, so this path costs what it
costs in vLLM; the built-in parsers do not take it.

Streaming: content is passed on as the parser's streaming method reports it,
until the parser reports the start of a tool call; from then on the text is
only buffered. At the end the parser's complete-text method extracts the
calls, and they go through the same check as ours (`ToolSet.check`): all
valid -> they are sent (whole, like ours), with any content the parser
found that was not yet sent; otherwise the unsent text is content. So a
vLLM parser can never hand a client a call that is not a tool or whose
arguments do not fit the schema.
"""

from __future__ import annotations

from typing import Any

from streamproxy.filters.base import Part, content, tool_args, tool_call
from streamproxy.filters.registry import Source
from streamproxy.filters.toolset import ToolSet

from .vllm_parser_filter import VllmParserFilter


def registered(name: str) -> bool:
    from vllm.tool_parsers import ToolParserManager

    return name in ToolParserManager.list_registered()


class VllmParserSpec:
    """One request's vLLM parser class, its pydantic request and what it asks of the request."""

    def __init__(self, name: str, tokenizer: Any, tools: list[dict[str, Any]]) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        if tokenizer is None:
            raise ValueError(f"vLLM tool parser '{name}' needs the engine's tokenizer")
        self.cls = ToolParserManager.get_tool_parser(name)
        self.tokenizer = tokenizer
        self.request = ChatCompletionRequest.model_validate(
            {"model": "x", "messages": [{"role": "user", "content": ""}], "tools": tools, "tool_choice": "auto"}
        )
        self.request = self.new_parser().adjust_request(self.request)
        self.keep_special_tokens = self.request.skip_special_tokens is False

    def new_parser(self) -> Any:
        try:
            return self.cls(self.tokenizer, self.request.tools)
        except TypeError:
            return self.cls(self.tokenizer)

    def __call__(self, tools: ToolSet, *, parallel: bool = True) -> VllmToolCallFilter:
        return VllmToolCallFilter(self, tools, parallel)


class VllmToolCallFilter(VllmParserFilter):
    def __init__(self, spec: VllmParserSpec, tools: ToolSet, parallel: bool) -> None:
        super().__init__()
        self.parser = spec.new_parser()
        self.request = spec.request
        self.tools = tools
        self.parallel = parallel
        self.sent = ""
        self.buffering = False
        self.calls = 0

    def content(self, part: Part, out: list[Part]) -> None:
        prev_text, prev_ids, new_ids = self.advance(part)
        if self.buffering:
            return
        try:
            delta = self.parser.extract_tool_calls_streaming(prev_text, self.text, part.text, prev_ids, self.ids, new_ids, self.request)
        except Exception:
            self.buffering = True
            return
        if delta is None:
            return
        if delta.tool_calls:
            self.buffering = True
        if delta.content:
            out.append(content(delta.content))
            self.sent += delta.content

    def flush(self) -> list[Part]:
        out: list[Part] = []
        try:
            info = self.parser.extract_tool_calls(self.text, self.request)
        except Exception:
            info = None
        calls = [(tc.function.name, tc.function.arguments) for tc in info.tool_calls] if info and info.tools_called else []
        unsent = self.text[len(self.sent) :] if self.text.startswith(self.sent) else ""
        if calls and all(self.tools.check(name, args) for name, args in calls):
            found = info.content or ""
            rest = found[len(self.sent) :] if found.startswith(self.sent) else ""
            if rest.strip():
                out.append(content(rest))
            for name, args in calls[: None if self.parallel else 1]:
                out.extend(tool_call(self.calls, name))
                out.append(tool_args(self.calls, args))
                self.calls += 1
        elif unsent:
            out.append(content(unsent))
        return out

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.calls and reason == "stop" else reason


SOURCE = Source("vllm:", "vLLM's registry", registered, VllmParserSpec)
