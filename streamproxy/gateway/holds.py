"""Budget holds: a request's worst case, reserved against its key's token budget while it runs. Sans-IO.

A key's budget was checked only when a request started, so the requests
already running could overshoot it by all they generated. Now admission
holds each request's worst case (`worst_case`: an estimate of its prompt
plus the most it may generate) and refuses one whose hold does not fit in
what is left: spent (the ledger's sums, keyring.py) + held by the key's
requests running + this one's worst case must stay within the budget. When
the request ends, however it ends, its hold is released and its real tokens
are counted instead, in one step on the event loop (keyring.release_hold and
books.recorder, the request's finish subscribers), so between the two
nothing is uncounted.

The worst case, without a tokenizer (the gateway has none) and without
walking the messages: the body's bytes / `budgets.prompt_bytes_per_token`
(4 by default) for the prompt (JSON's quotes and keys make it generous for
English text; text of fewer bytes per token (code, CJK), or a Responses
`previous_response_id` whose earlier turns the replica adds, can exceed it:
that difference is the one overshoot left in a single process; 1 makes it
an upper bound for byte-level BPE tokenizers), plus the request's own cap on what it generates
times its choices (its API's `apis.spec.ApiSpec.cap`: `max_completion_tokens`
or `max_tokens` (chat, legacy completions, with `n` or `best_of`),
`max_output_tokens` (Responses), `max_tokens` (Anthropic)); the config's `budgets.default_max_tokens` when it
names none. Routes that generate nothing (embeddings, count_tokens,
tokenize) hold nothing: they are refused only once the budget is spent.

`Holds` is one process's: the sum held per key id, and `Hold`s released
once (`release` is idempotent), so a hold can never be released twice or
leak past its request's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamproxy.apis.spec import ApiSpec
from streamproxy.gateway.config import Budgets


@dataclass(frozen=True, slots=True)
class WorstCase:
    prompt: int  # estimated from the body's size
    completion: int  # the request's cap times its choices, or the default
    capped: bool  # the request named its cap (else the default was held)

    @property
    def tokens(self) -> int:
        return self.prompt + self.completion


NOTHING = WorstCase(0, 0, True)


def worst_case(api: ApiSpec, generates: bool, data: dict[str, Any], body_bytes: int, budgets: Budgets) -> WorstCase:
    """The most a request may cost: prompt (estimated) + completion (its cap, else the default: `api.cap`)."""
    if not generates:
        return NOTHING
    cap, choices = api.cap(data)
    completion = (cap or budgets.default_max_tokens) * choices
    return WorstCase(body_bytes // budgets.prompt_bytes_per_token + 1, completion, cap is not None)


class Hold:
    """One request's reservation; `release()` gives it back (once, however often it is called)."""

    __slots__ = ("_holds", "key_id", "tokens")

    def __init__(self, holds: Holds, key_id: str, tokens: int) -> None:
        self._holds = holds
        self.key_id = key_id
        self.tokens = tokens

    def release(self) -> None:
        tokens, self.tokens = self.tokens, 0
        if tokens:
            self._holds._give_back(self.key_id, tokens)


class Holds:
    """The tokens held per key id by this process's requests running."""

    __slots__ = ("by_key", "running")

    def __init__(self) -> None:
        self.by_key: dict[str, int] = {}
        self.running = 0  # holds not yet released

    def held(self, key_id: str) -> int:
        return self.by_key.get(key_id, 0)

    def take(self, key_id: str, tokens: int) -> Hold:
        self.by_key[key_id] = self.by_key.get(key_id, 0) + tokens
        self.running += 1
        return Hold(self, key_id, tokens)

    def total(self) -> int:
        return sum(self.by_key.values())

    def _give_back(self, key_id: str, tokens: int) -> None:
        self.running -= 1
        left = self.by_key.get(key_id, 0) - tokens
        if left > 0:
            self.by_key[key_id] = left
        else:
            self.by_key.pop(key_id, None)
