"""vLLM's engine-core logprob rows -> engine-neutral `TokenLogprob`s, for the direct route.

Per sampled token the engine core sends a row: the sampled token (with its rank), then the top k
(`LogprobsLists`); the prompt's come once as `LogprobsTensors`. Here rows become `TokenLogprob`s
directly, without vLLM's dicts or per-token decoding, each token id's (text, bytes) cached. The result
equals vLLM's path case by case; the rare row whose order the dict's (rank, id) sort decides (a tie)
goes through that rule itself (`_by_dict`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .base import TokenLogprob, token_text


class LogprobTokens:
    """A token id's (text, bytes) as logprobs show them (`token_text` of its vocabulary bytes), cached."""

    __slots__ = ("_token_bytes", "_cache")

    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        self._cache: dict[int, tuple[str, bytes]] = {}

    def __call__(self, token_id: int) -> tuple[str, bytes]:
        got = self._cache.get(token_id)
        if got is None:
            data = self._token_bytes(token_id)
            got = self._cache[token_id] = (token_text(data), data)
        return got


def _rows(arrays: Sequence[Any], count: int | None, width: int | None) -> tuple[list[Any], list[Any], list[Any]]:
    """(token ids, logprobs, ranks) as Python lists: `count` rows (None: all), `width` columns (None: all)."""
    ids, lps, ranks = arrays[0], arrays[1], arrays[2]
    rows = slice(None, count)
    return ids[rows, :width].tolist(), lps[rows, :width].tolist(), ranks[rows].tolist()


def _by_dict(token_id: int, ids: list[int], lps: list[float], rank: int, top: int, every: bool
             ) -> tuple[float, int | None, list[tuple[int, int, float]]]:
    """vLLM's dict for one row and `vllm_stream`'s reading of it: (own logprob, own rank, [(rank, id, logprob)])."""
    ranked: dict[int, tuple[float, int]] = {}
    for column, (tid, lp) in enumerate(zip(ids, lps)):
        ranked[tid] = (lp, column or rank)
    own = ranked.get(token_id)
    every = every and top < 0
    best = sorted((r, tid, lp) for tid, (lp, r) in ranked.items() if every or r <= top)
    if own is None:
        return float("-inf"), None, best if every else best[:top]
    return own[0], own[1], best if every else best[:top]


def sample_logprobs(token_ids: Sequence[int], lists: Any, top: int, tokens: LogprobTokens) -> list[TokenLogprob]:
    """One output's sampled tokens with their top `top` (vLLM's `logprobs`), as `vllm_stream._logprobs` makes them."""
    if lists is None or not token_ids:
        return []
    id_rows, lp_rows, ranks = _rows(lists, len(token_ids), top + 1 if top >= 0 else None)
    out = []
    for token_id, ids, lps, rank in zip(token_ids, id_rows, lp_rows, ranks):
        try:
            column = ids.index(token_id, 1)
        except ValueError:
            column = 0
        text, data = tokens(token_id)
        if ids[0] != token_id or (column == 0 and 0 <= rank <= top):  # unusual: the dict's own rule
            value, _, best = _by_dict(token_id, ids, lps, rank, top, False)
            alternatives = [TokenLogprob(tid, *tokens(tid), lp) for _, tid, lp in best]
        else:
            value = lps[column]
            alternatives = [TokenLogprob(tid, *tokens(tid), lp) for tid, lp in zip(ids[1:], lps[1:])] if top > 0 else []
        out.append(TokenLogprob(token_id, text, data, value, alternatives))
    return out


def prompt_logprobs(prompt_ids: Sequence[int], tensors: Any, top: int, tokens: LogprobTokens) -> list[TokenLogprob]:
    """The prompt's logprobs (vLLM's `prompt_logprobs`; -1: every column), as `vllm_stream.prompt_logprobs_of` makes
    them: the first token unscored, then each with its own rank and the top `top` with theirs."""
    if not prompt_ids:
        return []
    first_text, first_data = tokens(prompt_ids[0])
    out = [TokenLogprob(prompt_ids[0], first_text, first_data, None)]
    if tensors is None:
        return out
    id_rows, lp_rows, ranks = _rows(tensors, None, top + 1 if top >= 0 else None)
    for token_id, ids, lps, rank in zip(prompt_ids[1:], id_rows, lp_rows, ranks):
        try:
            column = ids.index(token_id, 1)
        except ValueError:
            column = 0
        text, data = tokens(token_id)
        if ids[0] != token_id or (column == 0 and (top < 0 or rank <= top)):
            value, own_rank, best = _by_dict(token_id, ids, lps, rank, top, True)
            alternatives = [TokenLogprob(tid, *tokens(tid), lp, rank=r) for r, tid, lp in best]
        else:
            value, own_rank = lps[column], column or rank
            alternatives = [TokenLogprob(tid, *tokens(tid), lp, rank=r)
                            for r, (tid, lp) in enumerate(zip(ids[1:], lps[1:]), 1)]
        out.append(TokenLogprob(token_id, text, data, value, alternatives, own_rank))
    return out
