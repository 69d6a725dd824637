"""A key's token budget holds each request's worst case while it runs (gateway/holds.py, keyring.py).

The worst case of every API's body (sans-IO); a hold refused, taken and given back once; requests
racing for a small budget on each store (the fake, SQLite, PostgreSQL) never bill more than it; the
hold of a request released however it ends (answered, streamed, cut by its client before or after
the first token, a replica failing mid-stream or unreachable, a replica's 400, a timeout, refused
for the budget itself); and two gateways sharing one PostgreSQL ledger: each counts the other's holds
once it refreshed, and a burst on both at once stays within the documented bound.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest

from engine_adapter.fake import FakeScript
from streamproxy.apis.anthropic.spec import ANTHROPIC
from streamproxy.apis.responses.spec import RESPONSES
from streamproxy.apis.spec import OPENAI
from streamproxy.errors import QuotaExceeded
from streamproxy.gateway import keyring as keyring_module
from streamproxy.gateway.config import Budgets, ConfigError
from streamproxy.gateway.config_file import split
from streamproxy.gateway.holds import NOTHING, Holds, WorstCase, worst_case
from streamproxy.gateway.keyring import Keyring
from streamproxy.ledger.keys import StoredKey, period_start
from streamproxy.ledger.memory import MemoryStore
from streamproxy.ledger.records import LedgerRecord, UsageQuery
from streamproxy.ledger.store import LedgerStore, open_store
from streamproxy.ledger.writer import Ledger
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat, sample
from tests.support import wait_until

ADMIN = "sk-admin-holds"
PROMPT = 24  # the fake replica's prompt tokens for chat()
BUDGETS = Budgets()


@pytest.fixture(autouse=True)
def quick_refresh(monkeypatch):
    monkeypatch.setattr(keyring_module, "REFRESH", 0.1)


# -- the worst case (sans-IO) ---------------------------------------------------------------------


@pytest.mark.parametrize(("api", "body", "completion", "capped"), [
    (OPENAI, {"max_completion_tokens": 50, "max_tokens": 10}, 50, True),  # the newer name first
    (OPENAI, {"max_tokens": 10, "n": 3}, 30, True),
    (OPENAI, {"prompt": "x", "max_tokens": 10, "n": 2, "best_of": 4}, 40, True),  # legacy completions
    (OPENAI, {"messages": []}, 4096, False),
    (OPENAI, {"max_tokens": True, "n": "2"}, 4096, False),  # not numbers: the default, one choice
    (OPENAI, {"max_tokens": -5, "n": 0}, 4096, False),
    (RESPONSES, {"max_output_tokens": 64, "max_tokens": 9}, 64, True),
    (RESPONSES, {"input": "hi"}, 4096, False),
    (ANTHROPIC, {"max_tokens": 100, "n": 5}, 100, True),
])
def test_the_worst_case_is_the_prompts_estimate_plus_the_cap_times_the_choices(api, body, completion, capped) -> None:
    assert worst_case(api, True, body, 400, BUDGETS) == WorstCase(prompt=101, completion=completion, capped=capped)
    assert worst_case(api, True, body, 400, Budgets(default_max_tokens=7, prompt_bytes_per_token=1)).prompt == 401
    assert worst_case(api, False, body, 400, BUDGETS) == NOTHING  # embeddings, count_tokens: nothing generated


@pytest.mark.parametrize(("budgets", "says"), [
    ("{default_max_tokens: 0}", "gateway config: `budgets`: `default_max_tokens` must be a positive number"),
    ("{prompt_bytes_per_token: -1}", "gateway config: `budgets`: `prompt_bytes_per_token` must be a positive number"),
    ("{default_max_token: 10}", "unknown field `default_max_token` - at `$.budgets`"),
])
def test_a_bad_budgets_section_is_refused_naming_the_field(budgets: str, says: str) -> None:
    text = f"deployments: [{{name: a, id: dep-a, upstreams: ['http://127.0.0.1:1']}}]\nbudgets: {budgets}\n"
    with pytest.raises(ConfigError, match=re.escape(says)):
        split(text)
    good = split("deployments: [{name: a, id: dep-a, upstreams: ['http://127.0.0.1:1']}]\nbudgets: {default_max_tokens: 512}\n")[0]
    assert good.budgets == Budgets(default_max_tokens=512, prompt_bytes_per_token=4)


def test_a_hold_is_given_back_once() -> None:
    holds = Holds()
    a, b = holds.take("k", 30), holds.take("k", 12)
    other = holds.take("j", 5)
    assert (holds.held("k"), holds.held("j"), holds.total(), holds.running) == (42, 5, 47, 3)
    a.release()
    a.release()  # again: nothing more
    assert (holds.held("k"), holds.running) == (12, 2)
    b.release()
    other.release()
    assert (holds.by_key, holds.total(), holds.running) == ({}, 0, 0)


async def test_the_keyring_refuses_a_hold_that_does_not_fit_and_says_why() -> None:
    ring = Keyring(MemoryStore())
    key = StoredKey(id="k1", hash="h", deployments=["*"], budget_tokens=100, budget_period="month")
    ring.add(key)
    entry = ring.by_id("k1")
    assert entry is not None
    now = time.time()
    _, end = period_start(now, "month")
    resets = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end))
    first = ring.reserve(entry, WorstCase(10, 50, True), now)
    assert first is not None and ring.held("k1") == 60
    # 60 held + 60 > 100, but 60 alone fits what is left: refused until the running request ends.
    with pytest.raises(QuotaExceeded) as held:
        ring.reserve(entry, WorstCase(10, 50, True), now)
    assert (held.value.message, held.value.retry_after, held.value.headers()["x-should-retry"]) == (
        "API key `k1` has 100 tokens left of its monthly budget of 100 tokens (0 used), 60 of them held by its "
        "requests running, and this request may use up to 60 tokens (about 10 prompt + 50 completion, its "
        "max_tokens); retry when they end", 1, "true")  # passes once they end: the SDKs may retry it
    # More than is left at all, with no cap of its own: the default was held, and the message says so.
    with pytest.raises(QuotaExceeded) as big:
        ring.reserve(entry, WorstCase(10, 4096, False), now)
    assert big.value.message == (
        "API key `k1` has 100 tokens left of its monthly budget of 100 tokens (0 used) and this request may use "
        "up to 4106 tokens (about 10 prompt + 4096 completion, the gateway's default hold: send max_tokens); "
        f"it resets at {resets}")
    assert big.value.retry_after == max(1, int(end - now))
    assert big.value.headers()["x-should-retry"] == "false"  # not before the period turns
    assert ring.reserve(entry, NOTHING, now) is None  # a route generating nothing holds nothing
    first.release()
    assert ring.held("k1") == 0
    assert ring.reserve(entry, WorstCase(40, 60, True), now) is not None  # exactly the budget fits
    assert sample("streamproxy_gateway_budget_held_tokens") == 100


async def test_keyrings_sharing_a_store_count_each_others_holds_and_unwritten_records() -> None:
    store = MemoryStore()
    key = StoredKey(id="k1", hash="h", deployments=["*"], budget_tokens=100, budget_period="day", created=1)
    await store.put_key(key)
    one, other = Keyring(store), Keyring(store)
    await one.refresh()
    await other.refresh()
    entry = one.by_id("k1")
    assert entry is not None
    hold = one.reserve(entry, WorstCase(10, 30, True), time.time())
    assert hold is not None
    assert other.held_elsewhere("k1") == 0  # not before one published and other read
    await one.refresh()
    await other.refresh()
    assert other.held_elsewhere("k1") == 40
    other_entry = other.by_id("k1")
    assert other_entry is not None
    with pytest.raises(QuotaExceeded, match="40 of them held by its requests running"):
        other.reserve(other_entry, WorstCase(10, 51, True), time.time())
    # It ends: its record is buffered (not written), so one still publishes its 35 real tokens.
    hold.release()
    record = LedgerRecord(ts_us=int(time.time() * 1e6), request_id="r", deployment="d", replica=None, key_id="k1",
                          route="/v1/chat/completions", status=200, prompt_tokens=20, completion_tokens=15)
    one.queued(record)
    await one.refresh()
    await other.refresh()
    assert (other.held_elsewhere("k1"), other.spent("k1")) == (35, 0)
    await store.write([record])  # written: in the sums, no longer in what one publishes
    one.written([record])
    await one.refresh()
    await other.refresh()
    assert (other.held_elsewhere("k1"), other.spent("k1")) == (0, 35)
    # A keyring that stops clears its rows at once.
    one.holds.take("k1", 7)
    await one.refresh()
    await other.refresh()
    assert other.held_elsewhere("k1") == 7
    await one.stop()
    await other.refresh()
    assert other.held_elsewhere("k1") == 0


async def test_a_record_the_ledger_dropped_still_counts_until_its_period_ends() -> None:
    """The ledger's buffer full (its store down for long) drops a record: the tokens were billed, so
    the key's spend counts them here and in what this process publishes, though no sum ever will."""
    store = MemoryStore()
    await store.put_key(StoredKey(id="k1", hash="h", deployments=["*"], budget_tokens=100, budget_period="day", created=1))
    one, other = Keyring(store), Keyring(store)
    await one.refresh()
    now = time.time()

    def record(ts: float, request_id: str) -> LedgerRecord:
        return LedgerRecord(ts_us=int(ts * 1e6), request_id=request_id, deployment="d", replica=None, key_id="k1",
                            route="/v1/chat/completions", status=200, prompt_tokens=20, completion_tokens=15)

    one.dropped(record(now, "today"))
    one.dropped(record(period_start(now, "day")[0] - 60, "yesterday"))  # arrived in the period before
    assert one.spent("k1") == 70
    await one.refresh()  # the store's sums have neither; the one from yesterday's period no longer counts
    assert one.spent("k1") == 35
    entry = one.by_id("k1")
    assert entry is not None
    with pytest.raises(QuotaExceeded, match=r"65 tokens left .* \(35 used\)"):
        one.reserve(entry, WorstCase(10, 60, True), now)
    await other.refresh()
    assert other.held_elsewhere("k1") == 35  # published as this process's, to every process sharing the store


async def test_a_full_ledger_buffer_drops_the_record_not_the_keys_spend(replica, gateway, session):
    store = MemoryStore()
    r = await replica()
    gw = await gateway(deployments=[{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [r.base]}],
                       ledger=Ledger(store, max_buffered=0))  # every record dropped, as by a long outage
    gw.state.admin_key = ADMIN.encode()
    secret = await make_key(session, gw, "k", 10**6)
    async with session.post(gw.url("/v1/chat/completions"), json=chat(max_tokens=5), headers={"Authorization": f"Bearer {secret}"}) as resp:
        assert resp.status == 200
        usage = (await resp.json())["usage"]
    assert await wait_until(lambda: gw.state.ledger.dropped == 1, 5)
    assert store.rows == []
    assert gw.state.keyring.spent("k") == usage["prompt_tokens"] + usage["completion_tokens"] > 0


# -- through the gateway ------------------------------------------------------------------------


RACING = FakeScript(text=" word", ttft=2.0)  # every request of a burst is running when the last one arrives
RACER = chat(max_tokens=20, user="racer-1")  # 44 tokens on the fake replica


async def keyed(replica, gateway, store: LedgerStore, script: FakeScript | None = None, upstream: str | None = None,
                **settings: Any):
    r = await replica(script) if upstream is None else None
    base = upstream or r.base  # type: ignore[union-attr]
    deployments = [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [base]}]
    gw = await gateway(deployments=deployments, ledger=Ledger(store, interval=0.05), **settings)
    gw.state.admin_key = ADMIN.encode()
    return gw, r


async def make_key(session, gw, key_id: str, budget: int) -> str:
    async with session.post(gw.url("/v1/keys"), headers={"Authorization": f"Bearer {ADMIN}"},
                            json={"id": key_id, "deployments": ["*"], "budget_tokens": budget, "budget_period": "day"}) as resp:
        made = await resp.json()
        assert resp.status == 200, made
        return made["secret"]


def hold_of(body: dict[str, Any]) -> int:
    """What the gateway holds for `body` as aiohttp sends it (json.dumps)."""
    return len(json.dumps(body).encode()) // 4 + 1 + body["max_tokens"]


async def billed(store: LedgerStore, gw, key_id: str) -> tuple[int, int]:
    """(records, prompt + completion tokens) of the key, everything written."""
    assert await gw.state.ledger.flush()
    rows = await store.usage(UsageQuery(start_us=0, end_us=2**62, group_by=("key",), key_id=key_id))
    return (rows[0].requests, rows[0].total_tokens) if rows else (0, 0)


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path):
    url = {"memory": "memory:", "sqlite": f"sqlite://{tmp_path}/ledger.db"}.get(request.param)
    s = await open_store(url or request.getfixturevalue("postgres_server").database())
    yield s  # the gateway's ledger closes it


async def test_requests_racing_for_a_small_budget_never_bill_more_than_it(replica, gateway, session, store):
    gw, _ = await keyed(replica, gateway, store, RACING)
    budget = 250
    secret = await make_key(session, gw, "racer", budget)
    body = RACER  # (`user` pads the body: its bytes / 4 cover the fake's prompt)
    per_request = PROMPT + 20
    hold = hold_of(body)
    assert per_request <= hold  # the prompt's estimate covers the prompt: in one process, no overshoot at all
    headers = {"Authorization": f"Bearer {secret}"}

    async def one() -> tuple[int, dict]:
        async with session.post(gw.url("/v1/chat/completions"), json=body, headers=headers) as resp:
            return resp.status, await resp.json()

    answers = await asyncio.gather(*(one() for _ in range(20)))  # 20 x 44 = 880 tokens without holds
    ok = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] != 200]
    assert len(ok) == budget // hold, [a[1] for a in refused][:1]  # as many as fit (6 x 44 would not, anyway)
    assert {(s, b["error"]["code"], b["error"]["type"]) for s, b in refused} == {(429, "insufficient_quota", "insufficient_quota")}
    # Refused for the holds of those running (or, on a machine slow enough that they ended first, for what is left).
    assert all(b["error"]["message"].endswith(("held by its requests running, and this request may use up to "
                                               f"{hold} tokens (about {hold - 20} prompt + 20 completion, its max_tokens); "
                                               "retry when they end", "Z")) for _, b in refused)
    assert await wait_until(lambda: gw.state.keyring.holds.running == 0, 5.0)
    # Once they ended, their real tokens count and the holds are gone: more fit, until the budget does not.
    while (await one())[0] == 200:
        pass
    records, tokens = await billed(store, gw, "racer")
    assert tokens <= budget
    assert budget - tokens < hold  # stopped only when the next one's worst case no longer fit
    assert tokens == per_request * (tokens // per_request)
    assert gw.state.keyring.held("racer") == 0


SLOW = FakeScript(text=" word", token_delay=0.05)  # a token every 50 ms until max_tokens
SILENT = FakeScript(text=" word", ttft=30.0)
BROKEN = FakeScript(text=" word", fail_after=2)


async def _answered(session, gw, headers, stream: bool) -> None:
    async with session.post(gw.url("/v1/chat/completions"), json=chat(max_tokens=5, stream=stream), headers=headers) as resp:
        assert resp.status == 200
        await resp.read()


async def _cut(session, gw, headers, stream: bool) -> None:
    """The client leaves once the request holds (and, streaming, once two tokens came)."""
    resp = await session.post(gw.url("/v1/chat/completions"), json=chat(max_tokens=1000, stream=stream), headers=headers)
    if stream:
        seen = b""
        while seen.count(b" word") < 2:
            seen += await asyncio.wait_for(resp.content.readany(), 10)
    resp.close()


async def _call(session, gw, headers, body: dict[str, Any], status: int, code: str | None = None) -> None:
    async with session.post(gw.url("/v1/chat/completions"), json=body, headers=headers) as resp:
        raw = await resp.read()
        assert resp.status == status, raw
        if code is not None:
            text = raw.decode()
            assert f'"code":"{code}"' in text.replace(" ", ""), text


WAYS = {
    "answered": (None, lambda s, g, h: _answered(s, g, h, False)),
    "streamed": (None, lambda s, g, h: _answered(s, g, h, True)),
    "cut mid-stream": (SLOW, lambda s, g, h: _cut(s, g, h, True)),
    "cut before an answer": (SILENT, None),
    # (Its in-band engine error is a break the gateway would move to another replica; it has none.)
    "replica fails mid-stream": (BROKEN, lambda s, g, h: _call(s, g, h, chat(max_tokens=50, stream=True), 200, "upstream_unavailable")),
    "replica unreachable": ("refused", lambda s, g, h: _call(s, g, h, chat(max_tokens=5), 503, "upstream_unavailable")),
    "replica's 400": (None, lambda s, g, h: _call(s, g, h, chat(max_tokens=5, temperature="hot"), 400)),
    "timed out": (SILENT, lambda s, g, h: _call(s, g, h, chat(max_tokens=5), 504)),
}


@pytest.mark.parametrize("way", list(WAYS))
async def test_a_hold_is_released_however_the_request_ends(replica, gateway, session, way):
    from tests.gateway.conftest import refused_url

    script, act = WAYS[way]
    store = MemoryStore()
    if script == "refused":
        gw, r = await keyed(replica, gateway, store, upstream=refused_url())
    else:
        gw, r = await keyed(replica, gateway, store, script, request_timeout=0.5 if way == "timed out" else 600)  # type: ignore[arg-type]
    secret = await make_key(session, gw, "k", 10**9)
    headers = {"Authorization": f"Bearer {secret}"}
    holds = gw.state.keyring.holds
    if way == "cut before an answer":
        call = asyncio.ensure_future(session.post(gw.url("/v1/chat/completions"), json=chat(max_tokens=5), headers=headers))
        assert await wait_until(lambda: r is not None and r.engine.num_running == 1, 10)
        assert holds.running == 1 and holds.held("k") == hold_of(chat(max_tokens=5))  # held while it runs
        call.cancel()
    else:
        assert act is not None
        await act(session, gw, headers)
    assert await wait_until(lambda: holds.running == 0 and holds.held("k") == 0, 10), (holds.running, holds.by_key)
    # Its record and real tokens took the hold's place (the key's spend is what the ledger has).
    assert await wait_until(lambda: len(store.rows) == 1, 10)
    record = store.rows[0][1]
    assert gw.state.keyring.spent("k") == (record.prompt_tokens or 0) + (record.completion_tokens or 0)


async def test_a_request_refused_for_the_budget_holds_nothing(replica, gateway, session):
    gw, _ = await keyed(replica, gateway, MemoryStore())
    secret = await make_key(session, gw, "small", 10)
    async with session.post(gw.url("/v1/chat/completions"), json=chat(max_tokens=5), headers={"Authorization": f"Bearer {secret}"}) as resp:
        answer = await resp.json()
    assert (resp.status, answer["error"]["code"]) == (429, "insufficient_quota")
    assert "has 10 tokens left of its daily budget of 10 tokens (0 used)" in answer["error"]["message"]
    assert (gw.state.keyring.holds.running, gw.state.keyring.held("small")) == (0, 0)


async def two_gateways(replica, gateway, session, postgres_server, budget: int):
    url = postgres_server.database()
    a, _ = await keyed(replica, gateway, await open_store(url), RACING)
    b, _ = await keyed(replica, gateway, await open_store(url), RACING)
    secret = await make_key(session, a, "pair", budget)
    assert await wait_until(lambda: b.state.keyring.by_id("pair") is not None, 5)
    headers = {"Authorization": f"Bearer {secret}"}

    async def one(gw) -> int:
        async with session.post(gw.url("/v1/chat/completions"), json=RACER, headers=headers) as resp:
            await resp.read()
            return resp.status

    return a, b, one



async def test_two_gateways_on_one_postgresql_count_each_others_holds(replica, gateway, session, postgres_server):
    """Requests running on one gateway hold the key's budget on the other too, once it refreshed."""
    budget, hold = 250, hold_of(RACER)
    a, b, one = await two_gateways(replica, gateway, session, postgres_server, budget)
    first = [asyncio.ensure_future(one(a)) for _ in range(3)]  # 3 holds on a, for 2 s
    assert await wait_until(lambda: a.state.keyring.held("pair") == 3 * hold, 5)
    # Published by a and read by b (or, on a machine slow enough that they ended first, their records).
    assert await wait_until(lambda: b.state.keyring.held_elsewhere("pair") + b.state.keyring.spent("pair") >= 3 * (PROMPT + 20), 5)
    second = await asyncio.gather(*(one(b) for _ in range(5)))  # only what is left after a's holds fits on b
    assert second.count(200) == (budget - 3 * hold) // hold == (budget - 3 * (PROMPT + 20)) // hold
    assert await asyncio.gather(*first) == [200] * 3
    assert await a.state.ledger.flush() and await b.state.ledger.flush()
    _, tokens = await billed(a.state.ledger.store, a, "pair")
    assert tokens == (3 + second.count(200)) * (PROMPT + 20) <= budget
    # Written, a's requests are in the records b sums, and no longer in what a publishes.
    assert await wait_until(lambda: b.state.keyring.held_elsewhere("pair") == 0 and b.state.keyring.spent("pair") == tokens, 5)


async def test_a_burst_on_two_gateways_at_once_stays_within_the_documented_bound(replica, gateway, session, postgres_server):
    """Holds taken on two gateways within one refresh are not yet seen by the other: each admits what
    fits in its own view, so they bill at most the budget plus what the other admitted meanwhile, here
    (N - 1) x all of it; once they refreshed, neither admits what does not fit."""
    budget = 250
    a, b, one = await two_gateways(replica, gateway, session, postgres_server, budget)
    statuses = await asyncio.gather(*(one(gw) for gw in (a, b) * 10))  # 20 x 44 = 880 tokens without holds
    assert await a.state.ledger.flush() and await b.state.ledger.flush()
    _, tokens = await billed(a.state.ledger.store, a, "pair")
    assert 1 <= statuses.count(200) <= 2 * (budget // hold_of(RACER))  # each admitted what fit in its own view
    assert tokens <= 2 * budget  # budget + (N - 1) x what was left (all of it: nothing was spent before)
    assert await wait_until(lambda: all(gw.state.keyring.spent("pair") >= tokens for gw in (a, b)), 5)
    for gw in (a, b):
        assert await one(gw) == 429
    _, after = await billed(a.state.ledger.store, a, "pair")
    assert after == tokens


async def test_a_log_line_that_fails_to_write_still_books_the_request(replica, gateway, session, monkeypatch):
    """The books run before the access-log line, and the line is best effort: a line that cannot be
    written fails no request and loses neither its record nor its hold's release."""
    from streamproxy.http import accesslog

    def broken(text: str) -> None:
        raise OSError("the access log's disk is full")

    monkeypatch.setattr(accesslog, "enabled", lambda: True)
    monkeypatch.setattr(accesslog, "write", broken)
    store = MemoryStore()
    gw, _ = await keyed(replica, gateway, store)
    secret = await make_key(session, gw, "k", 10**9)
    await _answered(session, gw, {"Authorization": f"Bearer {secret}"}, True)
    holds = gw.state.keyring.holds
    assert await wait_until(lambda: holds.running == 0 and holds.held("k") == 0, 10), (holds.running, holds.by_key)
    assert await wait_until(lambda: len(store.rows) == 1, 10)
    record = store.rows[0][1]
    assert (record.status, record.completion_tokens) == (200, 3)  # the fake's default answer: 3 tokens
    assert gw.state.keyring.spent("k") == (record.prompt_tokens or 0) + (record.completion_tokens or 0)
