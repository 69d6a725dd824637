"""Fixtures for the gateway's tests: fake-engine replicas and the gateway, in-process on the real runner.

`replica(script, runner=, **settings)` is `streamproxy serve --engine fake` in this
process (`runner="pooling"`: an embedding model): `create_app(Settings(...), FakeEngine(...))` on `make_runner` (the
runner both commands use) with a TCPSite on 127.0.0.1, serving the model as
`SERVED` (`ready=False`: without waiting for its engine). Its `seen` lists every request it answered (method, path,
headers, the model its body named, its request id), recorded as the
response goes out; `ssl_certfile=`/`ssl_keyfile=` serve it over HTTPS (`base` is then https://); `stop()` ends it at once, as a crash would (its port
then refuses connections)
and `restart()` brings a new engine up on the same port.

`gateway(*upstreams, **settings)` is `create_gateway_app` on the same
runner, with one deployment `DEPLOYMENT` (id `DEPLOYMENT_ID`, served as
`SERVED`) over the given replicas or URLs, unless `deployments=` says
otherwise; `keys=` and `upstream=` are the config's sections; `ledger=` a
request ledger (`streamproxy.ledger.writer.Ledger`; none by default).

`stub(handler)` is a raw TCP server for the replica behaviours a real one
will not show on demand (a stream cut mid-event, an answer that never
comes): `handler(reader, writer)` plays the replica's side once the request
is read (probes get a 200 without it); `stub(handler, ssl=context)` serves it over TLS (`base` is then https://).

The loop is uvloop's and every test is bounded, as in tests/production
(its `session`, `access_log` and bound are reused from there).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from ssl import SSLContext
from typing import Any

import msgspec
import pytest
from aiohttp import web

from engine_adapter.fake import FakeEngine, FakeScript
from harness.process import free_port
from harness.waiting import wait_until
from streamproxy.config import Settings
from streamproxy.gateway import probes
from streamproxy.gateway.app import create_gateway_app
from streamproxy.gateway.balance import Pool
from streamproxy.gateway.config import GatewayConfig
from streamproxy.gateway.config_file import check
from streamproxy.gateway.state import STATE_KEY, GatewayState
from streamproxy.http.app import create_app
from streamproxy.http.context import CONTEXT
from streamproxy.http.server import Runner, make_runner
from streamproxy.http.tls import server_context
from streamproxy.ledger.writer import Ledger
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, read_http_request
from tests.production.conftest import _bounded, access_log, event_loop_policy, session  # noqa: F401  (fixtures)
from tests.support.token_replica import TokenReplica

DEFAULT_SCRIPT = FakeScript(tokens=["Hel", "lo", " world"])
# How long a runner's cleanup waits for a connection's handler (the server's is DRAIN_GRACE): a
# connection accepted as the server stops can otherwise hold the cleanup until the peer times out.
SHUTDOWN = 0.2


@dataclass(frozen=True)
class Seen:
    """One request a replica answered."""

    method: str
    path: str
    headers: dict[str, str]
    model: str | None
    request_id: str


class Replica:
    def __init__(self, script: FakeScript, settings: dict[str, Any], runner: str = "generate") -> None:
        self.script = script
        self.settings = settings
        self.runner_kind = runner
        self.seen: list[Seen] = []
        self.port = 0
        self.runner: Runner | None = None
        self.engine: FakeEngine

    @property
    def base(self) -> str:
        scheme = "https" if self.settings.get("ssl_certfile") else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def inference(self) -> list[Seen]:
        return [s for s in self.seen if s.path != "/health"]

    async def start(self, ready: bool = True) -> None:
        self.engine = FakeEngine(self.script, served_names=[SERVED], runner=self.runner_kind)  # type: ignore[arg-type]
        conf = Settings(engine="fake", host="127.0.0.1", port=self.port, served_model_name=[SERVED], **self.settings)
        app = create_app(conf, self.engine)
        app.on_response_prepare.append(self._saw)
        self.runner = make_runner(app, conf, shutdown_timeout=SHUTDOWN)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, backlog=2048, ssl_context=server_context(conf)).start()
        self.port = self.runner.addresses[0][1]
        if ready:
            assert await wait_until(lambda: self.engine.state == "ready", timeout=5.0), self.engine.state

    async def _saw(self, request: web.Request, response: web.StreamResponse) -> None:
        ctx = request[CONTEXT]
        self.seen.append(Seen(request.method, request.path, dict(request.headers), ctx.model, ctx.request_id))

    async def stop(self) -> None:
        """Gone at once, as a crashed replica: the port refuses, every open connection is dropped."""
        if self.runner is not None:
            runner, self.runner = self.runner, None
            for site in list(runner.sites):
                await site.stop()
            if runner.server is not None:
                for connection in runner.server.connections:
                    connection.force_close()
            await runner.cleanup()

    async def restart(self) -> None:
        """A new engine on the same port."""
        await self.stop()
        await self.start()


class Gateway:
    def __init__(self, app: web.Application, runner: Runner, port: int) -> None:
        self.app = app
        self.runner = runner
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def url(self, path: str) -> str:
        return self.base + path

    @property
    def state(self) -> GatewayState:
        return self.app[STATE_KEY].state

    def pool(self, name: str = DEPLOYMENT) -> Pool:
        return self.state.pools[name]

    def in_order(self, name: str = DEPLOYMENT) -> None:
        """Make the deployment's choice deterministic: of two candidates, the first listed
        (power of two choices keeps the less loaded one, and the first on a tie)."""
        self.pool(name)._rng = _InOrder()  # type: ignore[assignment]


class _InOrder:
    def sample(self, population: list, k: int) -> list:
        return list(population)[:k]


StartReplica = Callable[..., Awaitable[Replica]]
StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def replica() -> AsyncIterator[StartReplica]:
    started: list[Replica] = []

    async def start(script: FakeScript | None = None, *, ready: bool = True, runner: str = "generate", **settings: Any) -> Replica:
        r = Replica(script or DEFAULT_SCRIPT, settings, runner)
        started.append(r)
        await r.start(ready)
        return r

    yield start
    for r in started:
        await r.stop()


def config(upstreams: list[str], *, deployments: list[dict] | None = None, keys: list[dict] | None = None,
           upstream: dict | None = None) -> GatewayConfig:
    deps = deployments or [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": upstreams}]
    conf = msgspec.convert({"deployments": deps, "keys": keys or [], "upstream": upstream or {}}, GatewayConfig)
    check(conf)
    return conf


@pytest.fixture
async def gateway(replica: StartReplica) -> AsyncIterator[StartGateway]:
    """Depends on `replica` so that gateways stop before their replicas."""
    started: list[Runner] = []

    async def start(*upstreams: Replica | str, deployments: list[dict] | None = None, keys: list[dict] | None = None,
                    upstream: dict | None = None, ledger: Ledger | None = None, **settings: Any) -> Gateway:
        urls = [u if isinstance(u, str) else u.base for u in upstreams]
        conf = Settings(host="127.0.0.1", port=0, **settings)
        app = create_gateway_app(conf, config(urls, deployments=deployments, keys=keys, upstream=upstream), ledger)
        runner = make_runner(app, conf, shutdown_timeout=SHUTDOWN)
        await runner.setup()
        started.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=2048).start()
        return Gateway(app, runner, runner.addresses[0][1])

    yield start
    for runner in started:
        await runner.cleanup()


def refused_url() -> str:
    """A loopback URL nothing listens on: connecting is refused."""
    return f"http://127.0.0.1:{free_port()}"


class Stub:
    """A raw TCP "replica". It reads each request; the gateway's `GET /health` probes get a
    200, every other request is recorded in `requests` and answered by `handler(reader, writer)`."""

    def __init__(self, handler: StubHandler, ssl: SSLContext | None = None) -> None:
        self.handler = handler
        self.ssl = ssl
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.server: asyncio.Server | None = None
        self.base = ""

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl)
        scheme = "https" if self.ssl is not None else "http"
        self.base = f"{scheme}://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await read_http_request(reader)
            if request[0].startswith("GET /health "):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                return
            self.requests.append(request)
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


StubHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def stub() -> AsyncIterator[Callable[..., Awaitable[Stub]]]:
    started: list[Stub] = []

    async def start(handler: StubHandler, ssl: SSLContext | None = None) -> Stub:
        s = Stub(handler, ssl)
        await s.start()
        started.append(s)
        return s

    yield start
    for s in started:
        assert s.server is not None
        s.server.close()


class Rounds:
    """Rounds of active health probes finished so far (by every gateway of the test);
    each function in `after` is called at the end of every round."""

    def __init__(self) -> None:
        self.done = 0
        self.after: list[Callable[[], None]] = []


@pytest.fixture
def probe_rounds(monkeypatch: pytest.MonkeyPatch) -> Rounds:
    rounds = Rounds()
    original = probes.probe_once

    async def counted(state: GatewayState, pools: list[Pool]) -> None:
        await original(state, pools)
        rounds.done += 1
        for hook in rounds.after:
            hook()

    monkeypatch.setattr(probes, "probe_once", counted)
    return rounds


# Fake vLLM replicas that speak `return_token_ids` (tests/support/token_replica.py), sharing their next break.
@pytest.fixture
async def pair() -> AsyncIterator[Callable[..., Awaitable[tuple[list[TokenReplica], list[tuple[str, int]]]]]]:
    started: list[TokenReplica] = []

    async def start(n: int = 2, **kw: Any) -> tuple[list[TokenReplica], list[tuple[str, int]]]:
        breaks: list[tuple[str, int]] = []
        replicas = [TokenReplica(f"r{i}", breaks, **kw) for i in range(n)]
        for r in replicas:
            await r.start()
            started.append(r)
        return replicas, breaks

    yield start
    for r in started:
        await r.stop()
