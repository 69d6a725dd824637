"""Fixtures for the HTTP tests: a real aiohttp server on a FakeEngine.

`serve(script, ...)` builds `create_app(Settings(...), FakeEngine(...))`,
starts it under pytest-aiohttp's test server (which, like server.py, runs
with `handler_cancellation=True`) and, unless told otherwise, waits until
the engine (started in a background task on app startup) is ready.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from engine_adapter.fake import FakeEngine, FakeScript
from harness.waiting import wait_until
from streamproxy.config import Settings
from streamproxy.http.app import create_app

Serve = Callable[..., Awaitable[tuple[Any, FakeEngine]]]


@pytest.fixture
def serve(aiohttp_client: Any) -> Serve:
    async def go(
        script: FakeScript | None = None,
        *,
        max_model_len: int = 4096,
        load_delay: float = 0.0,
        served_names: list[str] | None = None,
        wait_ready: bool = True,
        chat_template: str | None = None,
        template: str | None = None,
        **settings: Any,
    ) -> tuple[Any, FakeEngine]:
        engine = FakeEngine(
            script or FakeScript(tokens=["Hel", "lo", " world"]),
            max_model_len=max_model_len,
            load_delay=load_delay,
            served_names=served_names,
            chat_template=chat_template,
        )
        # `chat_template`: the model's own (the fake engine's); `template`: the server's --chat-template.
        app = create_app(Settings(engine="fake", chat_template=template, **settings), engine)
        client = await aiohttp_client(app)
        if wait_ready:
            assert await wait_until(lambda: engine.state == "ready", timeout=5.0), engine.state
        return client, engine

    return go
