"""The gateway's import rules (ARCHITECTURE.md, "The gateway"), read as test_layers.py reads the others.

Its sans-IO modules are fed bytes and clocks in tests: no aiohttp, asyncio, sockets or edge,
and of the gateway only each other (and its metrics). No module of the gateway reaches an
engine: replicas are reached over HTTP only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_layers import ENGINES, ROOT, modules, offending

GATEWAY_SANS_IO = ("config", "config_file", "relay", "prefix", "balance", "health", "limits", "lifecycle", "h1", "kube_pods", "holds",
                   # issue 35: KV-cache-aware routing and tenant fairness
                   "kv_events", "kv_index", "kv_feed", "kv_score", "fairq",
                   # issue 36: stream migration
                   "resume", "refusals", "serve_chunks", "vllm_chunks")


@pytest.mark.parametrize("name", GATEWAY_SANS_IO)
def test_gateway_sans_io_modules_import_no_io(name: str) -> None:
    path = ROOT / "streamproxy" / "gateway" / f"{name}.py"
    allowed = {"streamproxy.gateway"} | {f"streamproxy.gateway.{n}" for n in (*GATEWAY_SANS_IO, "metrics")}
    gateway_io = [m for m in offending(path, ("streamproxy.gateway",)) if m not in allowed]
    assert offending(path, ("aiohttp", "asyncio", "socket", "streamproxy.http", "streamproxy.cli") + ENGINES) + gateway_io == []


@pytest.mark.parametrize("path", modules("streamproxy/gateway"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_gateway_reaches_no_engine(path: Path) -> None:
    assert offending(path, ("engine_adapter",) + ENGINES) == []


AIOHTTP_CLIENT = ("ClientSession", "TCPConnector", "ClientTimeout", "aiohttp.request(")


@pytest.mark.parametrize("path", modules("streamproxy/gateway"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_gateway_has_one_http_client(path: Path) -> None:
    """Replicas are asked through `wire.Upstreams` only (kubernetes_asyncio's own client, in kube_api, is the library's)."""
    if path.name == "kube_api.py":
        return
    text = path.read_text()
    assert [name for name in AIOHTTP_CLIENT if name in text] == []


@pytest.mark.parametrize("path", modules("streamproxy"), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_kv_subscriber_imports_zmq(path: Path) -> None:
    """pyzmq is loaded only when a deployment subscribes to its replicas' KV events."""
    if path.relative_to(ROOT).as_posix() != "streamproxy/gateway/kv_subscriber.py":
        assert offending(path, ("zmq",)) == []
