"""`echo` on completions: each choice's text starts with its prompt, as vLLM sends it.

`Echo` transforms one engine request's Deltas (before the batch merge re-indexes them): each choice's
first Delta gets the prompt's text, and with logprobs the prompt's logprobs (first unscored), in front.
`prompt_only` is `max_tokens: 0`: the one token the engine was asked for is dropped, its count and
finish reason kept, as vLLM reports.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine_adapter.base import Delta, TokenLogprob


class Echo:
    __slots__ = ("text", "prompt_only", "logprobs", "_echoed")

    def __init__(self, text: str, n: int, *, prompt_only: bool = False, logprobs: bool = False) -> None:
        self.text = text
        self.prompt_only = prompt_only
        self.logprobs = logprobs
        self._echoed = [False] * n

    def __call__(self, deltas: Sequence[Delta], prompt_logprobs: list[TokenLogprob] | None) -> list[Delta]:
        out: list[Delta] = []
        for d in deltas:
            first = not self._echoed[d.index]
            if not first and not self.prompt_only:
                out.append(d)
                continue
            text: str | bytes = d.text
            logprobs = d.logprobs
            token_ids = d.token_ids
            if self.prompt_only:
                text, logprobs, token_ids = "", None, None
            if first:
                self._echoed[d.index] = True
                text = self.text + text if isinstance(text, str) else self.text.encode() + text
                if self.logprobs:
                    logprobs = [*(prompt_logprobs or ()), *(logprobs or ())]
            out.append(Delta(d.index, text, d.num_tokens, d.finish_reason, token_ids, logprobs))
        return out
