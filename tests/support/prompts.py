"""Requests the tests send everywhere, and what the fake engine makes of them."""

from __future__ import annotations

USER_HI = [{"role": "user", "content": "hi"}]
# FakeEngine's chat template renders [user "hi"] as "<|user|>hi\n<|assistant|>",
# one token per character.
USER_HI_PROMPT_TOKENS = len("<|user|>hi\n<|assistant|>")
