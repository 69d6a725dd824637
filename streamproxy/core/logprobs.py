"""Engine-neutral `TokenLogprob`s -> the two OpenAI logprobs shapes.

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...k]}], "refusal": null}`, `bytes`
the token's real bytes. Completions (legacy, parallel lists): `tokens`, `token_logprobs`,
`top_logprobs` (the sampled token plus the top k: up to k+1 entries) and `text_offset` in whole
characters (`CompletionLogprobs` keeps an incremental UTF-8 decoder). `-inf` becomes -9999.0. With
`echo` the prompt's tokens come first, the first unscored (`null`), as vLLM. vLLM's `prompt_logprobs`
extra: `null`, then `{"<token id>": {"logprob", "rank", "decoded_token"}}` per prompt token. With
`--return-tokens-as-token-ids` tokens are named `token_id:N`.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

from engine_adapter.base import TokenLogprob

_FLOOR = -9999.0


def _lp(value: float | None) -> float | None:
    return value if value is None or value > _FLOOR else _FLOOR


def _name(t: TokenLogprob, token_ids: bool) -> str:
    return f"token_id:{t.token_id}" if token_ids else t.token


def _bytes(t: TokenLogprob, token_ids: bool) -> list[int]:
    return list(f"token_id:{t.token_id}".encode()) if token_ids else list(t.bytes)


def chat_entries(tokens: Sequence[TokenLogprob], token_ids: bool = False) -> list[dict[str, Any]]:
    return [
        {
            "token": _name(t, token_ids),
            "logprob": _lp(t.logprob),
            "bytes": _bytes(t, token_ids),
            "top_logprobs": [
                {"token": _name(a, token_ids), "logprob": _lp(a.logprob), "bytes": _bytes(a, token_ids)} for a in t.top
            ],
        }
        for t in tokens
    ]


def chat_choice_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"content": entries, "refusal": None}


class CompletionLogprobs:
    """One choice's legacy logprobs; `add` per step, and the running text offset."""

    __slots__ = ("_decoder", "offset", "token_ids")

    def __init__(self, token_ids: bool = False) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.offset = 0
        self.token_ids = token_ids

    def add(self, tokens: Sequence[TokenLogprob]) -> dict[str, Any]:
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t in tokens:
            # Characters still pending are not counted yet, so a token that
            # finishes one starts where that character does.
            out["text_offset"].append(self.offset)
            self.offset += len(self._decoder.decode(t.bytes))
            out["tokens"].append(_name(t, self.token_ids))
            out["token_logprobs"].append(_lp(t.logprob))
            if t.logprob is None:  # a prompt's first token: nothing to score it by
                out["top_logprobs"].append(None)
                continue
            top = {_name(t, self.token_ids): _lp(t.logprob)}
            for a in t.top:
                top.setdefault(_name(a, self.token_ids), _lp(a.logprob))
            out["top_logprobs"].append(top)
        return out


def vllm_prompt_logprobs(tokens: Sequence[TokenLogprob]) -> list[dict[str, Any] | None]:
    """The prompt's logprobs in vLLM's `prompt_logprobs` shape."""
    out: list[dict[str, Any] | None] = []
    for t in tokens:
        if t.logprob is None:
            out.append(None)
            continue
        entry = {str(t.token_id): {"logprob": _lp(t.logprob), "rank": t.rank, "decoded_token": t.token}}
        for a in t.top:
            entry.setdefault(str(a.token_id), {"logprob": _lp(a.logprob), "rank": a.rank, "decoded_token": a.token})
        out.append(entry)
    return out
