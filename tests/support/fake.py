"""The fake engine as the tests use it: the request sent everywhere, what the
fake makes of it, and a start held back until the test lets it finish."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engine_adapter.fake import FakeEngine

# `list[Any]`: posted as raw JSON (requests, aiohttp) and passed to the OpenAI and Anthropic SDKs,
# whose message TypedDicts differ.
USER_HI: list[Any] = [{"role": "user", "content": "hi"}]
# FakeEngine's chat template renders [user "hi"] as "<|user|>hi\n<|assistant|>",
# one token per character.
USER_HI_PROMPT_TOKENS = len("<|user|>hi\n<|assistant|>")


def hold_start(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Every FakeEngine started from now on stays "loading" until the returned event is set.

    A test of the loading state then checks it for as long as it needs,
    however slow the machine, instead of racing a `load_delay`.
    """
    release = asyncio.Event()
    original = FakeEngine.start

    async def start(self: FakeEngine) -> None:
        await release.wait()
        await original(self)

    monkeypatch.setattr(FakeEngine, "start", start)
    return release
