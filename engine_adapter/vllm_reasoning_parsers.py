"""The rest of vLLM's reasoning-parser registry, behind the filter protocol.

`--reasoning-parser NAME` for a NAME that is not one of ours (see
`filters.registry`, which `SOURCE` joins), or `vllm:NAME`, resolves here: vLLM's
`ReasoningParserManager` (imported on first use, only in this module)
supplies the parser class, built per choice with the engine's tokenizer and
the request's chat template kwargs (some parsers read `enable_thinking`),
and `VllmReasoningFilter` drives it. Before the first token it sees the
rendered prompt as vLLM's streaming `Parser.parse_delta` shows it: given to the
parser (`set_prompt_token_ids`, from 0.33), and a prompt that already closes
the thinking (`is_reasoning_end`) makes the whole answer content; else the
parser may adjust its initial state (`adjust_initial_state_from_prompt`). Each CONTENT part goes through the
parser's streaming method; what it calls reasoning becomes REASONING parts,
what it calls content goes on as CONTENT (to the tool parser after it). At
the end, parsers built on vLLM's parser engine flush what they held back
(`finish_streaming`). A parser that raises turns into a pass-through: the
text is never lost, it is content from there on. `reasoning_tokens` is the
parser's own count over the choice's token ids.
"""

from __future__ import annotations

from typing import Any

from streamproxy.filters.base import CONTENT, Part, reasoning
from streamproxy.filters.registry import Source

from .vllm_compat import set_prompt_token_ids
from .vllm_parser_filter import VllmParserFilter

# name -> whether the parser needs special tokens kept in the text (one probe per name).
_KEEPS_SPECIAL: dict[str, bool] = {}


def registered(name: str) -> bool:
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


SOURCE = Source("vllm:", "vLLM's registry", registered, VllmReasoningSpec)
