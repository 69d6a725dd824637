"""The keys made through the admin API, as the gateway uses them: looked up by the secret's hash,
refreshed from the ledger's store every `REFRESH` s, and their budgets' spend.

A key's spend is the store's sum when last read plus this process's records since (`written`, `queued`,
and `dropped`, which the store will never sum); a batch written during a read may count twice until
the next one, so a key stops a little early, never late. `reserve` (at admission) holds a request's
worst case (holds.py) and refuses it with 429 `insufficient_quota` when spent + held + worst case is
over budget; `release_hold` (a finish subscriber) frees it as the real tokens are counted. Processes
sharing the store publish their unwritten holds (`put_holds`) and read the others' (`other_holds`,
stale after `STALE` s), which bounds overshoot across processes (docs/gateway.md). The store down:
the last keys and sums stay, with a warning.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import time
from collections import defaultdict

from streamproxy.errors import QuotaExceeded
from streamproxy.gateway.config import ApiKey
from streamproxy.gateway.holds import Hold, Holds, WorstCase
from streamproxy.gateway.limits import KeyLimiter
from streamproxy.gateway.metrics import BUDGET_HELD
from streamproxy.gateway.poll import StorePoll
from streamproxy.http.context import RequestContext
from streamproxy.ledger.keys import StoredKey, period_start
from streamproxy.ledger.records import LedgerRecord, UsageQuery
from streamproxy.ledger.store import LedgerStore

log = logging.getLogger("streamproxy.gateway")

REFRESH = 1.0  # s
STALE = 10.0  # s: another process's holds not renewed for this long are not counted (it is gone)


def release_hold(ctx: RequestContext) -> None:
    """A request ended, however it ended: its hold on its key's budget is given back (a finish subscriber)."""
    if ctx.hold is not None:
        ctx.hold.release()


class Entry:
    __slots__ = ("stored", "key", "limiter")

    def __init__(self, stored: StoredKey, limiter: KeyLimiter | None = None) -> None:
        self.stored = stored
        self.key = ApiKey(id=stored.id, key="(stored)", deployments=list(stored.deployments), rpm=stored.rpm, tpm=stored.tpm)
        self.limiter = limiter or KeyLimiter(stored.rpm, stored.tpm)


class Keyring:
    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self.by_hash: dict[str, Entry] = {}
        self._ids: dict[str, Entry] = {}
        self.made = False  # a key was ever made (the store has one, revoked or not)
        self._stored_spent: dict[str, int] = {}  # key id -> tokens in its current period, from the store
        self._unsaved: dict[str, int] = defaultdict(int)  # in this process's ledger buffer
        self._saved: dict[str, int] = defaultdict(int)  # written by this process since the last read began
        self._lost: dict[str, list[tuple[float, int]]] = defaultdict(list)  # (arrival s, tokens) never to be written
        self.holds = Holds()  # the worst cases of this process's requests running, per key
        self.process = f"{os.getpid()}-{os.urandom(6).hex()}"  # this process's rows of holds in the store
        self._others: dict[str, int] = {}  # key id -> what other processes hold for it, as last read
        self._published = False  # this process has rows of holds in the store
        BUDGET_HELD.set_function(self.holds.total)
        self._poll = StorePoll("keys", "keeping the last keys", self.refresh, lambda: REFRESH, "gateway-keyring")

    def __bool__(self) -> bool:
        """Whether the gateway asks for keys: once a key was made, also after it is revoked (revoking the
        last key must not open the gateway)."""
        return self.made

    def find(self, secret: str) -> Entry | None:
        return self.by_hash.get(hashlib.sha256(secret.encode()).hexdigest())

    def by_id(self, key_id: str) -> Entry | None:
        return self._ids.get(key_id)

    def add(self, stored: StoredKey) -> None:
        entry = self.by_hash[stored.hash] = Entry(stored)
        self._ids[stored.id] = entry
        self.made = True

    def remove(self, key_id: str) -> None:
        entry = self._ids.pop(key_id, None)
        if entry is not None:
            self.by_hash.pop(entry.stored.hash, None)

    def queued(self, record: LedgerRecord) -> None:
        """A record of a key's request is in the ledger's buffer."""
        tokens = (record.prompt_tokens or 0) + (record.completion_tokens or 0)
        if tokens and record.key_id is not None and record.key_id in self._ids:
            self._unsaved[record.key_id] += tokens

    def dropped(self, record: LedgerRecord) -> None:
        """A record of a key's request that the ledger's buffer was too full to take (the store down
        for long): its tokens were billed all the same, and count until the key's period ends."""
        tokens = (record.prompt_tokens or 0) + (record.completion_tokens or 0)
        if tokens and record.key_id is not None and record.key_id in self._ids:
            self._lost[record.key_id].append((record.ts_us / 1_000_000, tokens))

    def written(self, batch: list[LedgerRecord]) -> None:
        """The store has these records (the ledger's `on_written`)."""
        for record in batch:
            key_id = record.key_id
            if key_id is not None and key_id in self._unsaved:
                tokens = (record.prompt_tokens or 0) + (record.completion_tokens or 0)
                left = self._unsaved[key_id] - tokens
                if left > 0:
                    self._unsaved[key_id] = left
                else:
                    del self._unsaved[key_id]
                self._saved[key_id] += tokens

    def spent(self, key_id: str) -> int:
        return self._stored_spent.get(key_id, 0) + self._saved.get(key_id, 0) + self._not_in_store(key_id)

    def _not_in_store(self, key_id: str) -> int:
        """This process's tokens for the key that no sum of the store has: buffered, or dropped."""
        lost = self._lost.get(key_id)
        return self._unsaved.get(key_id, 0) + (sum(tokens for _, tokens in lost) if lost else 0)

    def held(self, key_id: str) -> int:
        """Tokens held by this key's requests running in this process."""
        return self.holds.held(key_id)

    def held_elsewhere(self, key_id: str) -> int:
        """What the other gateway processes sharing the store held for this key and had not yet
        written, as last read."""
        return self._others.get(key_id, 0)

    def reserve(self, entry: Entry, worst: WorstCase, now: float) -> Hold | None:
        """Hold `worst` against the key's budget until the request ends (None: the key has no budget,
        or the route generates nothing); QuotaExceeded (429 insufficient_quota) when it does not fit."""
        k = entry.stored
        budget, period = k.budget_tokens, k.budget_period
        if budget is None or period is None:
            return None
        used = self.spent(k.id)
        tokens = worst.tokens
        if used < budget and not tokens:
            return None
        held = self.holds.held(k.id) + self._others.get(k.id, 0)
        if used < budget and used + held + tokens <= budget:
            return self.holds.take(k.id, tokens)
        _, end = period_start(now, period)
        resets = dt.datetime.fromtimestamp(end, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        word = "daily" if period == "day" else "monthly"
        until_reset = max(1, int(end - now))
        if used >= budget:
            raise QuotaExceeded(f"API key `{k.id}` has used its {word} budget of {budget} tokens ({used} used); "
                                f"it resets at {resets}", retry_after=until_reset)
        left = budget - used
        cap = "its max_tokens" if worst.capped else "the gateway's default hold: send max_tokens"
        asks = (f"this request may use up to {tokens} tokens (about {worst.prompt} prompt + {worst.completion} "
                f"completion, {cap})")
        if tokens > left:
            raise QuotaExceeded(f"API key `{k.id}` has {left} tokens left of its {word} budget of {budget} tokens "
                                f"({used} used) and {asks}; it resets at {resets}", retry_after=until_reset)
        raise QuotaExceeded(f"API key `{k.id}` has {left} tokens left of its {word} budget of {budget} tokens "
                            f"({used} used), {held} of them held by its requests running, and {asks}; "
                            "retry when they end", retry_after=1,
                            should_retry=True)  # passes once they end: the SDKs may retry it after Retry-After

    async def refresh(self) -> None:
        every = await self.store.list_keys()
        keys = [k for k in every if k.revoked is None]
        now = time.time()
        self._forget_lost_before_their_period(keys, now)
        others = await self._share_holds({k.id for k in keys if k.budget_tokens is not None}, now)  # before the sums
        saved, self._saved = self._saved, defaultdict(int)  # in the sums read now (or written during the read)
        spent: dict[str, int] = {}
        for period in ("day", "month"):
            budgeted = [k.id for k in keys if k.budget_period == period]
            if not budgeted:
                continue
            start, end = period_start(now, period)
            try:
                rows = await self.store.usage(UsageQuery(start_us=start * 1_000_000, end_us=end * 1_000_000, group_by=("key",)))
            except BaseException:
                for key_id, tokens in saved.items():  # not read after all: still to be added
                    self._saved[key_id] += tokens
                raise
            wanted = set(budgeted)
            for row in rows:
                if row.key_id in wanted:
                    spent[row.key_id] = row.prompt_tokens + row.completion_tokens
        old = {e.stored.id: e for e in self.by_hash.values()}
        fresh: dict[str, Entry] = {}
        for k in keys:
            kept = old.get(k.id)
            fresh[k.hash] = kept if kept is not None and kept.stored == k else Entry(k, kept.limiter if kept else None)
        self.by_hash = fresh
        self.made = self.made or bool(every)
        self._ids = {e.stored.id: e for e in fresh.values()}
        self._stored_spent = spent
        self._others = others

    def _forget_lost_before_their_period(self, keys: list[StoredKey], now: float) -> None:
        """A dropped record counts until its key's budget period ends (or the key has no budget)."""
        periods = {k.id: k.budget_period for k in keys}
        for key_id, lost in list(self._lost.items()):
            period = periods.get(key_id)
            start = period_start(now, period)[0] if period is not None else None
            still = [(at, tokens) for at, tokens in lost if start is not None and at >= start]
            if still:
                self._lost[key_id] = still
            else:
                del self._lost[key_id]

    async def _share_holds(self, budgeted: set[str], now: float) -> dict[str, int]:
        """Publish what this process holds and has not written per budgeted key; the others' sums."""
        if not budgeted and not self._published:
            return {}
        now_us = int(now * 1_000_000)
        stale_us = now_us - int(STALE * 1_000_000)
        mine: dict[str, int] = {}
        for key_id in budgeted:
            tokens = self.holds.held(key_id) + self._not_in_store(key_id)
            if tokens > 0:
                mine[key_id] = tokens
        if mine or self._published:
            await self.store.put_holds(self.process, mine, now_us, stale_us)
            self._published = bool(mine)
        return await self.store.other_holds(self.process, stale_us) if budgeted else {}

    def start(self) -> None:
        self._poll.start()

    async def stop(self) -> None:
        await self._poll.stop()
        if self._published:  # the others stop counting this process's holds at once, not after STALE
            now_us = int(time.time() * 1_000_000)
            try:
                await self.store.put_holds(self.process, {}, now_us, now_us - int(STALE * 1_000_000))
                self._published = False
            except Exception as exc:
                log.warning("keys: could not clear this process's holds in the ledger's store (%s: %s); "
                            "the others stop counting them within %.0f s", type(exc).__name__, exc, STALE)
