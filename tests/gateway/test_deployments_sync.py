"""Deployments made through the admin API, followed by every gateway sharing the ledger's store
(`gateway/deploysync.py`): a POST on one is routable on the other within a couple of seconds, a
PATCH's new upstream is followed, a DELETE is a 404 `model_not_found` there while a stream it runs
on the deleted deployment completes; a stored deployment that does not fit one gateway is refused
there with one ERROR line and the rest applied, and served once a reload makes room for it; the gateway's own changes swap nothing again; a
list read while this gateway changed its deployments is not applied over that change; the store
down keeps the deployments served."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import msgspec
import pytest

from engine_adapter.fake import FakeScript
from streamproxy.gateway import deploysync
from streamproxy.gateway.app import SYNC_KEY
from streamproxy.gateway.reload import reload
from streamproxy.gateway.state import STATE_KEY
from streamproxy.ledger.deployments import StoredDeployment
from streamproxy.ledger.memory import MemoryStore
from streamproxy.ledger.store import LedgerStore, open_store
from streamproxy.ledger.writer import Ledger
from tests.gateway.gateway_support import DEPLOYMENT, SERVED, chat, post
from tests.gateway.test_deployments_api import ADMIN, admin, chat_to, file_deployment, new
from tests.gateway.test_ledger_keys import eventually

SLOW = FakeScript(tokens=[f"t{i} " for i in range(40)], token_delay=0.05)


@pytest.fixture(autouse=True)
def quick_refresh(monkeypatch):
    assert deploysync.REFRESH <= 1.0  # "within a second"
    monkeypatch.setattr(deploysync, "REFRESH", 0.1)


async def sharing(replica, gateway, store: LedgerStore, extra: tuple[dict, ...] = ()):
    """A gateway with a config file of its own (`extra`: more deployments in it) on `store`."""
    r = await replica()
    return await gateway(deployments=[*file_deployment(r), *extra], ledger=Ledger(store, interval=0.05), admin_key=ADMIN)


async def routable(session, gw, model: str) -> bool:
    """A one-token request to `model` on `gw` is answered (a slow replica's too, at once)."""
    status, _, _ = await post(session, gw.url("/v1/chat/completions"), chat(model, max_tokens=1))
    return status == 200


async def holds(value: bool) -> bool:
    """A condition already known, for `eventually`."""
    return value


async def test_two_gateways_on_one_postgresql_follow_a_post_a_patch_and_a_delete(replica, gateway, session, postgres_server):
    url = postgres_server.database()
    a = await sharing(replica, gateway, await open_store(url))
    b = await sharing(replica, gateway, await open_store(url))
    slow, c = await replica(SLOW), await replica()
    status, _ = await admin(session, "POST", a.url("/v1/deployments"), new(slow))
    assert status == 200
    made = time.monotonic()
    assert await eventually(lambda: holds("tenant-bot" in b.state.pools), timeout=2.0)
    followed = time.monotonic() - made
    assert followed < 2.0, followed
    assert await routable(session, b, "tenant-bot")
    status, got = await admin(session, "GET", b.url("/v1/deployments/tenant-bot"))
    assert (got["id"], got["source"], [r["url"] for r in got["replicas"]]) == ("dep-tenant-bot", "api", [slow.base])
    # a's own change, read back by its poll, swaps nothing (its pools, health and prefix index stay).
    served = a.state
    store_a = a.app[SYNC_KEY].store
    version = await store_a.deployments_version()
    assert await eventually(lambda: holds(a.app[SYNC_KEY].seen == version))
    assert a.state is served

    async with session.post(b.url("/v1/chat/completions"), json=chat(model="tenant-bot", stream=True)) as resp:
        first = await resp.content.readline()
        assert first.startswith(b"data: ")
        # PATCH on a: b's new requests go to the new upstream; the stream stays on the old one.
        status, _ = await admin(session, "PATCH", a.url("/v1/deployments/dep-tenant-bot"), {"upstreams": [c.base]})
        assert status == 200

        async def on_c() -> bool:
            return await routable(session, b, "tenant-bot") and len(c.inference()) > 0

        assert await eventually(on_c, timeout=2.0)
        assert [p.deployment.upstreams for p in b.state.retiring] == [[slow.base]]  # the stream's, retiring
        # DELETE on a: a 404 on b.
        status, _ = await admin(session, "DELETE", a.url("/v1/deployments/tenant-bot"))
        assert status == 200

        async def gone() -> bool:
            status, body = await chat_to(session, b, "tenant-bot")
            return status == 404 and body["error"]["code"] == "model_not_found"

        assert await eventually(gone, timeout=2.0)
        assert [p.deployment.upstreams for p in b.state.retiring] == [[slow.base]]  # still streaming
        rest = await resp.read()
    assert (first + rest).endswith(b"data: [DONE]\n\n") and b'"error"' not in rest
    assert await eventually(lambda: holds(b.state.retiring == {}))
    status, listed = await admin(session, "GET", b.url("/v1/deployments"))
    assert [d["name"] for d in listed["data"]] == [DEPLOYMENT]


async def test_a_stored_deployment_that_does_not_fit_is_refused_there_with_one_line_and_the_rest_applied(
        replica, gateway, session, caplog):
    store = MemoryStore()  # shared by both gateways, as a database would be
    a = await sharing(replica, gateway, store)
    r = await replica()
    b = await sharing(replica, gateway, store, extra=({**new(r, name="clash"), "id": "dep-file-clash"},))
    caplog.set_level(logging.INFO, "streamproxy.gateway")
    # Written by some other version of the gateway: not a deployment this one parses.
    await store.put_deployment(StoredDeployment(id="dep-bad", name="bad", spec=json.dumps({"name": "bad", "id": "dep-bad",
                                                                                             "upstreams": ["ftp://127.0.0.1:1"]})))
    for name in ("clash", "fine"):
        status, got = await admin(session, "POST", a.url("/v1/deployments"), new(r, name=name))
        assert status == 200, got
    assert await eventually(lambda: routable(session, b, "fine"), timeout=2.0)
    assert b.state.describe("clash")["id"] == "dep-file-clash"  # b's file's, untouched
    assert (await chat_to(session, a, "clash"))[0] == 200 and a.state.describe("clash")["id"] == "dep-clash"
    # One more change and more polls: each refusal is logged once.
    assert (await admin(session, "PATCH", a.url("/v1/deployments/fine"), {"served_model": SERVED}))[0] == 200
    assert await eventually(lambda: holds(b.app[SYNC_KEY].seen == store.deployment_changes))
    await asyncio.sleep(3 * deploysync.REFRESH)
    clash = "deployment clash (dep-clash) from the ledger's store is not served: gateway config: 'clash' names two deployments"
    bad = ("deployment bad (dep-bad) from the ledger's store is not served: "
           "upstream 'ftp://127.0.0.1:1' is not an http(s) URL with a host (and a port, if any, from 1 to 65535)")
    b_lines = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.ERROR]
    assert b_lines.count(clash) == 1 and b_lines.count(bad) == 2  # bad: once by each gateway; clash: by b only
    assert {d.name for d in b.state.deployments} == {DEPLOYMENT, "clash", "fine"}
    # A reload whose file no longer has `clash`: the stored one is served at the next poll.
    current = b.app[STATE_KEY]
    file_config = msgspec.structs.replace(current.file_config, deployments=current.file_config.deployments[:1])
    assert reload(b.app, lambda: (current.state.settings, file_config))
    assert await eventually(lambda: holds("clash" in b.state.pools and b.state.pools["clash"].deployment.id == "dep-clash"), timeout=2.0)
    assert await routable(session, b, "clash")


class SlowList(MemoryStore):
    """A store whose next list waits for `release`: a read in flight while the gateway changes its deployments."""

    def __init__(self) -> None:
        super().__init__()
        self.listing = asyncio.Event()
        self.release: asyncio.Event | None = None
        self.down = False

    async def deployments_version(self) -> int:
        if self.down:
            raise ConnectionError("the fake store is down")
        return await super().deployments_version()

    async def list_deployments(self) -> list[StoredDeployment]:
        found = await super().list_deployments()
        if self.release is not None:
            self.listing.set()
            await self.release.wait()
        return found


async def test_a_list_read_while_this_gateway_made_a_change_does_not_undo_it(replica, gateway, session):
    store = SlowList()
    gw = await sharing(replica, gateway, store)
    r = await replica()
    sync = gw.app[SYNC_KEY]
    await sync.stop()  # this test drives the polls
    await store.put_deployment(StoredDeployment(id="dep-other", name="other", spec=json.dumps(new(r, name="other"))))
    store.release = asyncio.Event()
    poll = asyncio.create_task(sync.refresh())
    await store.listing.wait()  # the list is read ("other" alone), not yet returned
    status, _ = await admin(session, "POST", gw.url("/v1/deployments"), new(r, name="made-here"))
    assert status == 200
    store.release.set()
    assert await poll is False  # dropped: the served set changed during the read
    assert {d.name for d in gw.state.deployments} == {DEPLOYMENT, "made-here"}
    store.release = None
    assert await sync.refresh() is True  # read again: both
    assert {d.name for d in gw.state.deployments} == {DEPLOYMENT, "made-here", "other"}
    assert await routable(session, gw, "made-here") and await routable(session, gw, "other")


async def test_the_store_down_keeps_the_deployments_served_with_one_warning(replica, gateway, session, caplog):
    store = SlowList()
    gw = await sharing(replica, gateway, store)
    r = await replica()
    assert (await admin(session, "POST", gw.url("/v1/deployments"), new(r)))[0] == 200
    caplog.set_level(logging.INFO, "streamproxy.gateway")
    store.down = True
    await store.put_deployment(StoredDeployment(id="dep-later", name="later", spec=json.dumps(new(r, name="later"))))
    await asyncio.sleep(4 * deploysync.REFRESH)
    assert await routable(session, gw, "tenant-bot")
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert warnings == ["deployments: cannot refresh from the ledger's store (keeping the deployments served): "
                        "ConnectionError: the fake store is down"]
    store.down = False
    assert await eventually(lambda: routable(session, gw, "later"), timeout=2.0)
    assert "deployments: the ledger's store is back; deployments refreshed" in caplog.messages
