"""The start's first call to a vLLM engine core is bounded (engine_adapter/first_call.py):
asked again, as a fresh call, while no ask has been answered; the first answer wins and the other
asks are cancelled; an engine core that answers none fails the start with a message naming the
call, instead of leaving the server unready forever."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from engine_adapter.base import EngineFailure
from engine_adapter.first_call import first_call


class Core:
    """An engine core's utility calls: `answer_from` is the first ask (0-based) it answers."""

    def __init__(self, answer_from: int | None) -> None:
        self.answer_from = answer_from
        self.asks: list[asyncio.Future[tuple[str, ...]]] = []

    def ask(self) -> asyncio.Future[tuple[str, ...]]:
        call: asyncio.Future[tuple[str, ...]] = asyncio.get_running_loop().create_future()
        if self.answer_from is not None and len(self.asks) >= self.answer_from:
            call.set_result(("generate",))
        self.asks.append(call)
        return call


async def test_an_answer_in_time_is_returned_after_one_ask() -> None:
    core = Core(answer_from=0)
    assert await first_call(core.ask, "get_supported_tasks", timeout=1.0, reask=0.5) == ("generate",)
    assert len(core.asks) == 1


async def test_a_lost_answer_is_asked_again_and_the_earlier_ask_cancelled(caplog: pytest.LogCaptureFixture) -> None:
    core = Core(answer_from=2)  # the first two asks get no answer
    with caplog.at_level(logging.WARNING, "streamproxy.engine.vllm"):
        assert await first_call(core.ask, "get_supported_tasks", timeout=5.0, reask=0.01) == ("generate",)
    assert len(core.asks) == 3
    assert [a.cancelled() for a in core.asks] == [True, True, False]
    assert caplog.messages[-1] == "the engine core answered get_supported_tasks after 3 asks"
    assert re.fullmatch(r"the engine core has not answered get_supported_tasks after \d+ s; asking again \(ask 2\)", caplog.messages[0])


async def test_no_answer_fails_the_start_and_names_the_call() -> None:
    core = Core(answer_from=None)
    with pytest.raises(EngineFailure) as caught:
        await first_call(core.ask, "get_supported_tasks", timeout=0.05, reask=0.02)
    asks = len(core.asks)  # about 3 (at 0, 0.02 and 0.04 s), fewer on a machine that lags
    assert str(caught.value) == ("the engine core did not answer its first call (get_supported_tasks) "
                                 f"within 0.05 s of its start ({asks} asks)")
    assert asks >= 2 and all(a.cancelled() for a in core.asks)


async def test_a_call_that_fails_raises_its_error() -> None:
    async def failing() -> tuple[str, ...]:
        raise RuntimeError("engine core gone")

    with pytest.raises(RuntimeError, match="engine core gone"):
        await first_call(failing, "get_supported_tasks", timeout=1.0, reask=0.5)
