"""Reloading the config while serving (`gateway/reload.py`), in-process over fake-engine replicas.

SIGHUP (a real signal to this process, through `Reloader`) with many streams running:
none is cut, each ends with its [DONE]; a deployment the reload adds answers at once,
one it removes answers 404 `model_not_found` while its running stream completes, and is
stopped after; a file that does not parse or validate is refused with one log line
naming the file and the reason while the old config serves on; keys from the new file
apply; an unchanged deployment keeps its pool (health, index) and a changed one does not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from engine_adapter.fake import FakeScript
from harness.waiting import wait_until
from streamproxy.cli import load_gateway
from streamproxy.gateway.reload import Reloader, reload
from streamproxy.gateway.state import STATE_KEY
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat, error_body, post, sample
from tests.support import sse

OTHER = {"name": "other-bot", "id": "dep-0b", "served_model": SERVED}
TOKENS = 20
SLOW = FakeScript(tokens=[f"t{i} " for i in range(TOKENS)], token_delay=0.05)  # a stream lasts about 1 s
ANSWER = "".join(f"t{i} " for i in range(TOKENS))
# 2 s a stream: room for all of them to start and the reload to land while every one still runs.
LONG = FakeScript(tokens=[f"t{i} " for i in range(2 * TOKENS)], token_delay=0.2)  # about 8 s: 200 streams start well within it, even on a loaded machine


def write(path: Path, deployments: list[dict[str, Any]], **rest: Any) -> Path:
    path.write_text(yaml.safe_dump({"deployments": deployments, **rest}), encoding="utf-8")
    return path


def loader(path: Path) -> partial[Any]:
    return partial(load_gateway, str(path), ["--host", "127.0.0.1", "--port", "0"], strict=True)


def dep(replica: Any, **over: Any) -> dict[str, Any]:
    return {"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [replica.base], **over}


def reloads(outcome: str) -> float:
    return sample("streamproxy_gateway_config_reloads_total", outcome=outcome) or 0.0


async def read_stream(session: aiohttp.ClientSession, url: str, model: str, started: list[int]) -> tuple[int, bytes]:
    """One stream: counted in `started` once its first event arrived; its whole body."""
    async with session.post(url, json=chat(model=model, stream=True)) as resp:
        body = await resp.content.readany()
        started.append(1)
        body += await resp.read()
        return resp.status, body


def text_and_done(body: bytes) -> tuple[str, bool]:
    events = sse.events(body)
    text = "".join(c["delta"].get("content") or "" for e in events if e.data and not e.is_done for c in e.json()["choices"])
    return text, bool(events) and events[-1].is_done


@pytest.fixture
async def many() -> Any:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


async def test_sighup_with_streams_running_cuts_none_and_the_new_config_serves_at_once(replica, gateway, session, many, tmp_path):
    old_r, new_r = await replica(LONG), await replica()
    gw = await gateway(old_r)
    app = gw.app
    old_pool = gw.pool()
    path = write(tmp_path / "gw.yaml", [dep(new_r), {**OTHER, "upstreams": [new_r.base]}])
    reloader = Reloader(app, loader(path), str(path))
    reloader.install()
    try:
        n = 200  # as issue 28 asks
        started: list[int] = []
        streams = [asyncio.ensure_future(read_stream(many, gw.url("/v1/chat/completions"), DEPLOYMENT, started)) for _ in range(n)]
        assert await wait_until(lambda: len(started) == n, timeout=20.0)
        assert old_pool.active == n
        applied = reloads("applied")
        os.kill(os.getpid(), signal.SIGHUP)
        assert await wait_until(lambda: reloads("applied") == applied + 1, timeout=10.0)
        # Swapped while every stream runs: the changed deployment's old pool retires after them.
        assert not any(s.done() for s in streams)
        assert app[STATE_KEY].state.pools[DEPLOYMENT] is not old_pool
        assert list(app[STATE_KEY].state.retiring) == [old_pool]
        # New requests: the new replica, and the added deployment, right away.
        for model in (DEPLOYMENT, OTHER["name"]):
            status, _, got = await post(session, gw.url("/v1/chat/completions"), chat(model=model))
            assert status == 200, got
            assert json.loads(got)["model"] == model
        assert len(new_r.inference()) == 2
        done = await asyncio.gather(*streams)
        for status, body in done:
            assert status == 200
            assert text_and_done(body) == ("".join(f"t{i} " for i in range(2 * TOKENS)), True)
        assert len(old_r.inference()) == n
        assert old_pool.active == 0 and app[STATE_KEY].state.retiring == {}
    finally:
        reloader.uninstall()


async def test_a_removed_deployment_answers_404_while_its_stream_completes(replica, gateway, session, tmp_path, caplog):
    keep, gone = await replica(), await replica(SLOW)
    gw = await gateway(deployments=[dep(keep), {**OTHER, "upstreams": [gone.base]}])
    gone_pool = gw.pool(OTHER["name"])
    started: list[int] = []
    running = asyncio.ensure_future(read_stream(session, gw.url("/v1/chat/completions"), OTHER["name"], started))
    assert await wait_until(lambda: started == [1], timeout=10.0)
    path = write(tmp_path / "gw.yaml", [dep(keep)])
    caplog.set_level(logging.INFO, "streamproxy.gateway")
    assert reload(gw.app, loader(path), str(path))
    for by in ({"model": OTHER["name"]}, {"path": "/v1/deployments/dep-0b/chat/completions"}):
        url = gw.url(by.get("path", "/v1/chat/completions"))
        status, _, got = await post(session, url, chat(model=by.get("model")))
        assert status == 404
        if "model" in by:
            assert json.loads(got) == error_body("The model `other-bot` does not exist.", "invalid_request_error", "model_not_found", "model")
        else:
            assert json.loads(got)["error"]["code"] == "model_not_found"
    assert not running.done() and gone_pool in gw.state.retiring
    status, body = await running
    assert status == 200 and text_and_done(body) == (ANSWER, True)
    stopped = "deployment other-bot (dep-0b): stopped, as the reload removed or changed it"
    assert await wait_until(lambda: stopped in caplog.messages, timeout=5.0)
    assert gw.state.retiring == {}
    assert f"reloaded {path}: 1 deployments (unchanged: support-bot; new or changed: none; removed or replaced: other-bot), 0 keys" in caplog.messages
    # The kept deployment was not touched.
    status, _, _ = await post(session, gw.url("/v1/chat/completions"), chat())
    assert status == 200


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("deployments: [\n  {name: x, id: y\n", "not valid YAML: line 3, column 1: expected ',' or '}', but got '<stream end>' (while parsing a flow mapping at line 2, column 3)"),
        ("deployments:\n  - {name: x, id: y, upstreams: ['ftp://127.0.0.1:1']}\n", "deployment 'x': upstream 'ftp://127.0.0.1:1' is not an http(s) URL"),
        ("deployments:\n  - {name: x, id: y, upstreams: ['http://127.0.0.1:1'], replica: 2}\n", "gateway config: Object contains unknown field `replica` - at `$.deployments[0]`"),
        ("deployments:\n  - {name: x, id: y, upstreams: ['http://127.0.0.1:1']}\nrequest_timeout: soon\n", "a server flag: argument --request-timeout: invalid float value: 'soon'"),
    ],
    ids=["yaml", "url", "unknown-field", "server-flag"],
)
async def test_a_bad_config_is_refused_with_its_reason_and_the_old_one_serves(replica, gateway, session, tmp_path, caplog, text, reason):
    r = await replica()
    gw = await gateway(r)
    before, pool = gw.state, gw.pool()
    path = tmp_path / "gw.yaml"
    path.write_text(text, encoding="utf-8")
    refused = reloads("refused")
    caplog.set_level(logging.INFO, "streamproxy.gateway")
    assert not reload(gw.app, loader(path), str(path))
    assert [m for m in caplog.messages if m.startswith("reload")] == [f"reload refused: {path}: {reason}; still serving the previous config"]
    assert reloads("refused") == refused + 1
    assert gw.state is before and gw.pool() is pool
    status, _, got = await post(session, gw.url("/v1/chat/completions"), chat())
    assert status == 200, got


async def test_a_missing_file_is_refused_through_sighup_too(replica, gateway, session, tmp_path, caplog):
    r = await replica()
    gw = await gateway(r)
    path = tmp_path / "absent.yaml"
    reloader = Reloader(gw.app, loader(path), str(path))
    reloader.install()
    caplog.set_level(logging.INFO, "streamproxy.gateway")
    refused = reloads("refused")
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        assert await wait_until(lambda: reloads("refused") == refused + 1, timeout=10.0)
    finally:
        reloader.uninstall()
    assert f"reload refused: {path}: No such file or directory; still serving the previous config" in caplog.messages
    status, _, _ = await post(session, gw.url("/v1/chat/completions"), chat())
    assert status == 200


async def test_keys_from_the_new_file_apply_to_new_requests(replica, gateway, session, tmp_path):
    r = await replica()
    gw = await gateway(r, keys=[{"id": "team-a", "key": "sk-a"}])
    url = gw.url("/v1/chat/completions")
    assert (await post(session, url, chat(), Authorization="Bearer sk-a"))[0] == 200
    path = write(tmp_path / "gw.yaml", [dep(r)], keys=[{"id": "team-b", "key": "sk-b", "deployments": [DEPLOYMENT]}])
    assert reload(gw.app, loader(path), str(path))
    status, _, got = await post(session, url, chat(), Authorization="Bearer sk-a")
    assert status == 401
    assert json.loads(got) == error_body("incorrect API key provided", "authentication_error", "invalid_api_key")
    assert (await post(session, url, chat(), Authorization="Bearer sk-b"))[0] == 200
    # A setting: the edge's `api_key` (a key for every deployment) from the file's server flags.
    path = write(tmp_path / "gw.yaml", [dep(r)], keys=[{"id": "team-b", "key": "sk-b"}], api_key="sk-edge", request_timeout=7)
    assert reload(gw.app, loader(path), str(path))
    assert (await post(session, url, chat(), Authorization="Bearer sk-edge"))[0] == 200
    assert gw.state.settings.request_timeout == 7


async def test_unchanged_deployments_keep_their_pool_and_a_changed_one_gets_a_new_one(replica, gateway, session, tmp_path):
    a, b = await replica(), await replica()
    gw = await gateway(deployments=[dep(a), {**OTHER, "upstreams": [b.base]}])
    assert (await post(session, gw.url("/v1/chat/completions"), chat()))[0] == 200
    kept, changed = gw.pool(), gw.pool(OTHER["name"])
    replica_before = kept.replicas[0]
    assert replica_before.requests == 1
    path = write(tmp_path / "gw.yaml", [dep(a), {**OTHER, "upstreams": [b.base], "served_model": "renamed"}])
    assert reload(gw.app, loader(path), str(path))
    assert gw.pool() is kept and kept.replicas[0] is replica_before and gw.pool(DEPLOYMENT_ID) is kept
    assert gw.pool(OTHER["name"]) is not changed and gw.pool(OTHER["name"]).deployment.served_model == "renamed"
    # An `upstream:` policy change rebuilds every pool (health and index are built from it).
    path = write(tmp_path / "gw.yaml", [dep(a), {**OTHER, "upstreams": [b.base], "served_model": "renamed"}],
                 upstream={"consecutive_errors": 9})
    assert reload(gw.app, loader(path), str(path))
    assert gw.pool() is not kept and gw.pool().policy.consecutive_errors == 9
