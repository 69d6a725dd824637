"""A fake-engine app on aiohttp's test server, for hypothesis properties (which cannot be async).

`Live` runs `create_app` on its own event loop; each call (`post`, `get`)
runs that loop until the answer is read whole, so a property sends one
request per example synchronously. `errors` collects what the server logged
at ERROR (an unhandled exception is logged with its traceback, then
answered with a 500), so a property can say "nothing went wrong inside" as
well as "no 5xx".
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from engine_adapter.fake import FakeEngine, FakeScript
from streamproxy.config import Settings
from streamproxy.http.app import create_app

# Reasoning, then an answer with a hermes tool call: the filters run on every chat-like route.
SCRIPT = FakeScript(tokens=["<think>", "hm", "</think>", "Hel", "lo ", "<tool_call>", '{"name": "f", "arguments": {"city": "P"}}', "</tool_call>"])
SETTINGS = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes", "reasoning_parser": "qwen3", "access_log": "off"}


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Live:
    def __init__(self, *, runner: str = "generate", **settings: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.engine = FakeEngine(SCRIPT, record=False, runner=runner)  # type: ignore[arg-type]
        self.app = create_app(Settings(engine="fake", **{**SETTINGS, **settings}), self.engine)
        self.client: TestClient = self.loop.run_until_complete(self._start())
        self._log = _Collect()
        logging.getLogger("streamproxy").addHandler(self._log)

    async def _start(self) -> TestClient:
        client = TestClient(TestServer(self.app))
        await client.start_server()
        for _ in range(500):
            if self.engine.state == "ready":
                break
            await asyncio.sleep(0.01)
        assert self.engine.state == "ready"
        return client

    @property
    def errors(self) -> list[str]:
        return [r.getMessage() + (f" ({r.exc_info[1]!r})" if r.exc_info else "") for r in self._log.records]

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, str, bytes]:
        async def go() -> tuple[int, str, bytes]:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            async with self.client.request(method, path, data=body, headers=headers) as resp:
                return resp.status, resp.headers.get("Content-Type", ""), await resp.read()

        return self.loop.run_until_complete(asyncio.wait_for(go(), 30))

    def close(self) -> None:
        logging.getLogger("streamproxy").removeHandler(self._log)
        self.loop.run_until_complete(self.client.close())
        self.loop.close()
