"""vLLM's own output path into a `base.DeltaQueue`, the one `OutputStream` every engine fills.

`into_queue` replaces the `put` of a request's `RequestOutputCollector`: each `RequestOutput` becomes
`Delta`s put on the queue in vLLM's output step (pushed or coalesced as on the direct route). The last
output closes the queue; an exception (or a conversion that raises) closes it with our engine error
(`vllm_compat.engine_exception`) and never reaches vLLM's loop. Logprob dicts (and the prompt's, set
before the first output's Deltas) become `TokenLogprob`s with the vocabulary's bytes (`TokenBytes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .base import Delta, DeltaQueue, EngineFailure, TokenLogprob, token_text
from .vllm_compat import engine_exception

Bytes = Callable[[int], bytes]  # a token's bytes: `TokenBytes`
Wanted = tuple[Bytes, int] | None  # (its bytes, top-k): the request asked for (prompt) logprobs


def into_queue(collector: Any, logprobs: Wanted = None, prompt_logprobs: Wanted = None) -> DeltaQueue:
    """A `DeltaQueue` that vLLM's output handler fills through `collector.put`."""
    queue = DeltaQueue()
    ended = False

    def put(output: Any) -> None:
        nonlocal ended
        if ended:  # (vLLM's abort output after an error, say)
            return
        if isinstance(output, BaseException):
            ended = True
            queue.close(engine_exception(output))
            return
        try:
            deltas = _deltas(queue, output, logprobs, prompt_logprobs)
        except Exception as exc:  # never into vLLM's output handler
            ended = True
            queue.close(EngineFailure(f"{type(exc).__name__}: {exc}"))
            return
        queue.put(deltas)
        if output.finished:
            ended = True
            queue.close()

    early, collector.output = collector.output, None
    collector.put = put
    if early is not None:
        put(early)
    return queue


def _deltas(queue: DeltaQueue, out: Any, logprobs: Wanted, prompt_logprobs: Wanted) -> list[Delta]:
    if out.prompt_token_ids is not None:
        queue.prompt_tokens = len(out.prompt_token_ids)
    queue.cached_tokens = out.num_cached_tokens or 0
    if prompt_logprobs is not None and queue.prompt_logprobs is None and getattr(out, "prompt_logprobs", None):
        token_bytes, top = prompt_logprobs
        queue.prompt_logprobs = prompt_logprobs_of(out.prompt_token_ids, out.prompt_logprobs, token_bytes, top)
    if logprobs is None:
        return [Delta(o.index, o.text, len(o.token_ids), o.finish_reason, o.token_ids) for o in out.outputs]
    token_bytes, top = logprobs
    return [Delta(o.index, o.text, len(o.token_ids), o.finish_reason, o.token_ids, _logprobs(o.token_ids, o.logprobs, token_bytes, top))
            for o in out.outputs]


def _logprobs(token_ids: Sequence[int], positions: Any, token_bytes: Bytes, top: int) -> list[TokenLogprob] | None:
    """vLLM's per-position {token_id: Logprob} -> engine-neutral TokenLogprobs.

    vLLM puts the sampled token first (with its rank) and then the top-k by
    rank; bytes come from the vocabulary (`TokenBytes`), not from the decoded
    text, so a token that is half a character keeps its real bytes.
    """
    if positions is None:
        return None
    out: list[TokenLogprob] = []
    for token_id, ranked in zip(token_ids, positions):
        ranked = ranked or {}
        sampled = ranked.get(token_id)
        data = token_bytes(token_id)
        best = sorted((lp.rank, tid, lp.logprob) for tid, lp in ranked.items() if lp.rank is not None and lp.rank <= top)
        alternatives = []
        for _, tid, value in best[:top]:
            alt = token_bytes(tid)
            alternatives.append(TokenLogprob(tid, token_text(alt), alt, value))
        value = sampled.logprob if sampled is not None else float("-inf")
        out.append(TokenLogprob(token_id, token_text(data), data, value, alternatives))
    return out


def prompt_logprobs_of(prompt_ids: Sequence[int], positions: Any, token_bytes: Bytes, top: int) -> list[TokenLogprob]:
    """vLLM's prompt logprobs (None for the first position, then {token_id: Logprob}) -> TokenLogprobs.

    Each position's dict holds the prompt's own token (with its rank) and the
    top-k by rank (`top` -1: all it holds); the own token keeps its rank.
    """
    out: list[TokenLogprob] = []
    for token_id, ranked in zip(prompt_ids, positions):
        data = token_bytes(token_id)
        if not ranked:
            out.append(TokenLogprob(token_id, token_text(data), data, None))
            continue
        own = ranked.get(token_id)
        best = sorted((lp.rank, tid, lp.logprob) for tid, lp in ranked.items() if lp.rank is not None and (top < 0 or lp.rank <= top))
        alternatives = []
        for rank, tid, value in best if top < 0 else best[:top]:
            alt = token_bytes(tid)
            alternatives.append(TokenLogprob(tid, token_text(alt), alt, value, rank=rank))
        value = own.logprob if own is not None else float("-inf")
        out.append(TokenLogprob(token_id, token_text(data), data, value, alternatives, own.rank if own is not None else None))
    return out
