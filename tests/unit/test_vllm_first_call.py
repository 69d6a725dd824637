"""The start's first call to a vLLM engine core is bounded (engine_adapter/vllm_engine.py `first_call`):
an engine core that is up but never answers fails the start with a message naming the call,
instead of leaving the server unready forever; an answer in time is passed through."""

from __future__ import annotations

import asyncio

import pytest

from engine_adapter.base import EngineFailure
from engine_adapter.vllm_engine import first_call


async def test_an_answer_in_time_is_returned() -> None:
    async def answer() -> tuple[str, ...]:
        await asyncio.sleep(0)
        return ("generate",)

    assert await first_call(answer(), "get_supported_tasks", timeout=1.0) == ("generate",)


async def test_no_answer_fails_the_start_and_names_the_call() -> None:
    never: asyncio.Future[tuple[str, ...]] = asyncio.get_running_loop().create_future()
    with pytest.raises(EngineFailure) as caught:
        await first_call(never, "get_supported_tasks", timeout=0.01)
    assert str(caught.value) == ("the engine core did not answer its first call (get_supported_tasks) "
                                 "within 0.01 s of its start")
    assert never.cancelled()
