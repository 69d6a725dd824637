"""vLLM's tool-call and reasoning parser registries behind the filter protocol, beside ours.

`add()` joins vLLM's `ToolParserManager`/`ReasoningParserManager` (imported on first use) to
`filters.registry` (prefix `vllm:`); the CLI and each `VllmEngine` call it. vLLM's parsers run per
delta with the text and token ids before, after and of the delta, and the engine's tokenizer.
`VllmToolCallFilter` passes content on until the parser reports a tool call, then buffers; at the end
the complete-text method extracts the calls and `ToolSet.check` decides (all valid: sent whole;
otherwise the unsent text is content), so a client never gets a call that does not fit its tools.
`VllmReasoningFilter` shows the parser the rendered prompt first (a prompt that already ends the
thinking makes everything content) and splits CONTENT into REASONING/CONTENT; parsers on vLLM's parser
engine flush at the end (`finish_streaming`). A parser that raises becomes a pass-through.
"""

from __future__ import annotations

from typing import Any

from streamproxy.filters.base import CONTENT, ContentFilter, Part, content, reasoning, tool_args, tool_call
from streamproxy.filters.registry import REASONING_PARSERS, TOOL_PARSERS, Source
from streamproxy.filters.toolset import ToolSet

from .vllm_compat import set_prompt_token_ids


def add() -> None:
    TOOL_PARSERS.add(Source("vllm:", "vLLM's registry", _has_tool_parser, VllmParserSpec))
    REASONING_PARSERS.add(Source("vllm:", "vLLM's registry", _has_reasoning_parser, VllmReasoningSpec))


class VllmParserFilter(ContentFilter):
    def __init__(self) -> None:
        self.text = ""
        self.ids: list[int] = []

    def advance(self, part: Part) -> tuple[str, list[int], list[int]]:
        """Take `part` in: (the text before it, the ids before it, its ids)."""
        prev_text, prev_ids = self.text, self.ids
        new_ids = list(part.token_ids or ())
        self.text += part.text
        self.ids = prev_ids + new_ids
        return prev_text, prev_ids, new_ids


# -- tool calls --------------------------------------------------------------------------------


def _has_tool_parser(name: str) -> bool:
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


# -- reasoning --------------------------------------------------------------------------------


# name -> whether the parser needs special tokens kept in the text (one probe per name).
_KEEPS_SPECIAL: dict[str, bool] = {}


def _has_reasoning_parser(name: str) -> bool:
    from vllm.reasoning import ReasoningParserManager

    return name in ReasoningParserManager.list_registered()


class VllmReasoningSpec:
    """One request's vLLM reasoning parser class and template kwargs; calling it makes a filter."""

    def __init__(self, name: str, tokenizer: Any, template_kwargs: dict[str, Any], prompt_ids: list[int] | None = None) -> None:
        from vllm.reasoning import ReasoningParserManager

        if tokenizer is None:
            raise ValueError(f"vLLM reasoning parser '{name}' needs the engine's tokenizer")
        self.cls = ReasoningParserManager.get_reasoning_parser(name)
        self.tokenizer = tokenizer
        self.template_kwargs = template_kwargs
        self.prompt_ids = prompt_ids
        keeps = _KEEPS_SPECIAL.get(name)
        if keeps is None:
            keeps = _KEEPS_SPECIAL[name] = self._probe_special_tokens()
        self.keep_special_tokens = keeps

    def _probe_special_tokens(self) -> bool:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        request = ChatCompletionRequest.model_validate({"model": "x", "messages": [{"role": "user", "content": ""}]})
        return self.new_parser().adjust_request(request).skip_special_tokens is False

    def new_parser(self) -> Any:
        try:
            return self.cls(self.tokenizer, chat_template_kwargs=self.template_kwargs)
        except TypeError:
            return self.cls(self.tokenizer)

    def __call__(self) -> VllmReasoningFilter:
        return VllmReasoningFilter(self.new_parser(), self.prompt_ids)


class VllmReasoningFilter(VllmParserFilter):
    def __init__(self, parser: Any, prompt_ids: list[int] | None = None) -> None:
        super().__init__()
        self.parser = parser
        self.broken = False
        self.answering = prompt_ids is not None and self._prompt_closes_reasoning(prompt_ids)

    def _prompt_closes_reasoning(self, prompt_ids: list[int]) -> bool:
        parser = self.parser
        try:
            set_prompt_token_ids(parser, prompt_ids)
            if parser.is_reasoning_end(prompt_ids):
                return True
            adjust = getattr(parser, "adjust_initial_state_from_prompt", None)
            if adjust is not None:
                adjust(prompt_ids)
        except Exception:  # a parser that cannot read the prompt parses as if it had not seen it
            pass
        return False

    def content(self, part: Part, out: list[Part]) -> None:
        if self.broken or self.answering:
            out.append(part)
            return
        prev_text, prev_ids, new_ids = self.advance(part)
        try:
            delta = self.parser.extract_reasoning_streaming(prev_text, self.text, part.text, prev_ids, self.ids, new_ids)
        except Exception:
            self.broken = True
            out.append(part)
            return
        self._say(out, delta, part.token_ids)

    def flush(self) -> list[Part]:
        out: list[Part] = []
        finish = getattr(self.parser, "finish_streaming", None)
        if finish is not None and not self.broken:
            try:
                self._say(out, finish(), None)
            except Exception:
                pass
        return out

    @property
    def reasoning_tokens(self) -> int:
        try:
            return int(self.parser.count_reasoning_tokens(self.ids))
        except Exception:
            return 0

    @staticmethod
    def _say(out: list[Part], delta: Any, token_ids: Any) -> None:
        if delta is None:
            return
        if delta.reasoning:
            out.append(reasoning(delta.reasoning))
        if delta.content:
            out.append(Part(CONTENT, delta.content, token_ids=token_ids))
