"""Live servers for hypothesis properties (which cannot be async), each on an event loop of its own.

`Live` runs serve's `create_app` on aiohttp's test server; `LiveGateway`
runs `create_gateway_app` in front of fake-engine replicas (all on the
runner both commands use, TCP on loopback). Each call (`request`) runs the
loop until the answer is read whole, so a property sends one request per
example synchronously. `errors` collects what was logged at ERROR (the
gateway and its in-process replicas alike; an unhandled exception is
logged with its traceback, then answered with a 500), so a property can
say "nothing went wrong inside" as well as "no 5xx".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import msgspec
import uvloop
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from engine_adapter.fake import FakeEngine, FakeScript
from streamproxy.config import Settings
from streamproxy.gateway.app import create_gateway_app
from streamproxy.gateway.config import GatewayConfig
from streamproxy.gateway.config_file import check
from streamproxy.http.app import create_app
from tests.support.served import serve_app

# Reasoning, then an answer with a hermes tool call: the filters run on every chat-like route.
SCRIPT = FakeScript(tokens=["<think>", "hm", "</think>", "Hel", "lo ", "<tool_call>", '{"name": "f", "arguments": {"city": "P"}}', "</tool_call>"])
SETTINGS = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes", "reasoning_parser": "qwen3", "access_log": "off"}


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class _OnItsLoop:
    """What both live servers share: the loop, the log collector, one synchronous request."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._log = _Collect()
        logging.getLogger("streamproxy").addHandler(self._log)

    @property
    def errors(self) -> list[str]:
        return [r.getMessage() + (f" ({r.exc_info[1]!r})" if r.exc_info else "") for r in self._log.records]

    def _send(self, method: str, path: str, **kwargs: Any) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        raise NotImplementedError

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
        async def go() -> tuple[int, str, bytes]:
            sent = {"Content-Type": "application/json"} if body is not None else {}
            async with self._send(method, path, data=body, headers={**sent, **(headers or {})}) as resp:
                return resp.status, resp.headers.get("Content-Type", ""), await resp.read()

        return self.loop.run_until_complete(asyncio.wait_for(go(), 30))

    def _close(self) -> Awaitable[None]:
        raise NotImplementedError

    def close(self) -> None:
        logging.getLogger("streamproxy").removeHandler(self._log)
        self.loop.run_until_complete(self._close())
        self.loop.close()


class Live(_OnItsLoop):
    def __init__(self, *, runner: str = "generate", **settings: Any) -> None:
        super().__init__(asyncio.new_event_loop())
        self.engine = FakeEngine(SCRIPT, record=False, runner=runner)  # type: ignore[arg-type]
        self.app = create_app(Settings(engine="fake", **{**SETTINGS, **settings}), self.engine)
        self.client: TestClient = self.loop.run_until_complete(self._start())

    async def _start(self) -> TestClient:
        client = TestClient(TestServer(self.app))
        await client.start_server()
        for _ in range(500):
            if self.engine.state == "ready":
                break
            await asyncio.sleep(0.01)
        assert self.engine.state == "ready"
        return client

    def _send(self, method: str, path: str, **kwargs: Any) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        return self.client.request(method, path, **kwargs)

    def _close(self) -> Awaitable[None]:
        return self.client.close()


# The gateway's deployments: chat-like routes on two replicas, embeddings on a pooling one.
SERVED = "Qwen/Qwen3-8B"
CHAT = ("fuzz-chat", "dep-chat")  # (name, id)
EMBED = ("fuzz-embed", "dep-embed")


class LiveGateway(_OnItsLoop):
    """`create_gateway_app` (uvloop, as in production) over in-process fake-engine replicas serving
    `SERVED`: CHAT on two generating replicas with serve's fuzzing settings, EMBED on a pooling one.
    `keys` and `settings`: the gateway's config keys and edge settings."""

    def __init__(self, *, keys: list[dict[str, Any]] | None = None, **settings: Any) -> None:
        super().__init__(uvloop.new_event_loop())
        self.runners: list[web.BaseRunner] = []
        self.session: aiohttp.ClientSession
        self.base = self.loop.run_until_complete(self._start(keys or [], settings))

    async def _serve(self, app: web.Application, settings: Settings) -> str:
        runner, port = await serve_app(app, settings, shutdown_timeout=0.2)
        self.runners.append(runner)
        return f"http://127.0.0.1:{port}"

    async def _replica(self, runner: str) -> str:
        engine = FakeEngine(SCRIPT, record=False, runner=runner, served_names=[SERVED])  # type: ignore[arg-type]
        settings = Settings(engine="fake", host="127.0.0.1", port=0, served_model_name=[SERVED], **SETTINGS)  # type: ignore[arg-type]
        base = await self._serve(create_app(settings, engine), settings)
        for _ in range(500):
            if engine.state == "ready":
                return base
            await asyncio.sleep(0.01)
        raise AssertionError(f"replica not ready: {engine.state}")

    async def _start(self, keys: list[dict[str, Any]], settings: dict[str, Any]) -> str:
        chat = [await self._replica("generate"), await self._replica("generate")]
        embed = [await self._replica("pooling")]
        deployments = [
            {"name": name, "id": id_, "served_model": SERVED, "upstreams": upstreams}
            for (name, id_), upstreams in ((CHAT, chat), (EMBED, embed))
        ]
        config = msgspec.convert({"deployments": deployments, "keys": keys}, GatewayConfig)
        check(config)
        conf = Settings(host="127.0.0.1", port=0, access_log="off", **settings)
        base = await self._serve(create_gateway_app(conf, config), conf)
        self.session = aiohttp.ClientSession()
        return base

    def _send(self, method: str, path: str, **kwargs: Any) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        return self.session.request(method, self.base + path, **kwargs)

    async def _close(self) -> None:
        await self.session.close()
        for runner in reversed(self.runners):  # the gateway first, then its replicas
            await runner.cleanup()


