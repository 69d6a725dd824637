"""Budget holds: a request's worst case, reserved against its key's token budget while it runs. Sans-IO.

Admission refuses a request unless spent (keyring.py) + held + its `worst_case` fits the budget; at the
request's end its hold is released and its real tokens counted in one loop step. The worst case, with
no tokenizer: the body's bytes / `budgets.prompt_bytes_per_token` for the prompt (text of fewer bytes
per token, or a Responses `previous_response_id`, can exceed it; 1 is an upper bound for byte-level
BPE), plus the API's own generation cap times its choices (`apis.spec.ApiSpec.cap`, else
`budgets.default_max_tokens`). Routes that generate nothing hold nothing. A `Hold` is released once.
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
