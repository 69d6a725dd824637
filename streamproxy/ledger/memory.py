"""The fake `LedgerStore`: a list in memory, with the SQL stores' semantics (tests/contract).

`fail` makes the next writes raise (a store that is down), `stall` makes them
wait for an event (a slow one), `lose_acks` makes the next that many writes
store their batch and then raise (a commit whose answer was lost): what the
writer's tests need of a store. A record id already stored is skipped, as the
SQL stores' unique index does.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping, Sequence

import msgspec

from streamproxy.ledger import schema
from streamproxy.ledger.deployments import DeploymentExists, StoredDeployment
from streamproxy.ledger.keys import KeyExists, StoredKey
from streamproxy.ledger.records import (
    Cursor,
    LedgerRecord,
    RequestPage,
    RequestQuery,
    UsageQuery,
    UsageRow,
    period_of,
    sort_usage,
    usage_row,
)


class StoreDown(ConnectionError):
    pass


class MemoryStore:
    def __init__(self) -> None:
        self.rows: list[tuple[int, LedgerRecord]] = []  # (seq, record)
        self.version = 0
        self.fail = False
        self.stall: asyncio.Event | None = None
        self.lose_acks = 0  # the next writes that store their batch and then raise
        self.writes = 0  # batches stored
        self._ids: set[str] = set()  # record ids stored
        self.keys: dict[str, StoredKey] = {}
        self.deployments: dict[str, StoredDeployment] = {}
        self.deployment_changes = 0  # `deployments_version`
        self.holds: dict[tuple[str, str], tuple[int, int]] = {}  # (process, key id) -> (tokens, updated_us)

    async def migrate(self) -> int:
        schema.check_known(self.version)
        self.version = schema.LATEST
        return self.version

    async def write(self, records: Sequence[LedgerRecord]) -> None:
        if self.stall is not None:
            await self.stall.wait()
        if self.fail:
            raise StoreDown("the fake store is down")
        ids = self._ids
        for r in records:
            if r.record_id is not None:
                if r.record_id in ids:
                    continue
                ids.add(r.record_id)
            self.rows.append((len(self.rows) + 1, r))
        self.writes += 1
        if self.lose_acks > 0:
            self.lose_acks -= 1
            raise StoreDown("the fake store stored the batch, but its answer was lost")

    async def requests(self, query: RequestQuery) -> RequestPage:
        def keep(seq: int, r: LedgerRecord) -> bool:
            if r.deployment != query.deployment or not query.start_us <= r.ts_us < query.end_us:
                return False
            if query.key_id is not None and r.key_id != query.key_id:
                return False
            if query.status is not None and r.status != query.status:
                return False
            if query.status_class is not None and r.status // 100 != query.status_class:
                return False
            c = query.cursor
            return c is None or (r.ts_us, seq) < (c.ts_us, c.seq)

        found = sorted(((r.ts_us, seq, r) for seq, r in self.rows if keep(seq, r)), key=lambda t: (t[0], t[1]), reverse=True)
        page = found[: query.limit]
        more = len(found) > query.limit
        cursor = Cursor(page[-1][0], page[-1][1]).encode() if more else None
        return RequestPage(data=[r for _, _, r in page], has_more=more, next_cursor=cursor)

    async def usage(self, query: UsageQuery) -> list[UsageRow]:
        sums: dict[tuple[str | None, str | None, str | None], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        period = query.period
        for _, r in self.rows:
            if not query.start_us <= r.ts_us < query.end_us:
                continue
            if (query.deployment is not None and r.deployment != query.deployment) or (
                    query.key_id is not None and r.key_id != query.key_id):
                continue
            group = (
                r.deployment if "deployment" in query.group_by else None,
                r.key_id if "key" in query.group_by else None,
                period_of(r.ts_us, period) if period else None,
            )
            s = sums[group]
            s[0] += 1
            s[1] += r.prompt_tokens or 0
            s[2] += r.cached_prompt_tokens or 0
            s[3] += r.completion_tokens or 0
        return sort_usage([usage_row(d, k, p, *s) for (d, k, p), s in sums.items()])

    async def put_key(self, key: StoredKey) -> None:
        if key.id in self.keys or any(k.hash == key.hash for k in self.keys.values()):
            raise KeyExists(key.id)
        self.keys[key.id] = key

    async def list_keys(self) -> list[StoredKey]:
        return sorted(self.keys.values(), key=lambda k: (k.created, k.id))

    async def revoke_key(self, key_id: str, when: int) -> bool:
        key = self.keys.get(key_id)
        if key is None or key.revoked is not None:
            return False
        key.revoked = when
        return True

    async def put_deployment(self, deployment: StoredDeployment) -> None:
        if any(d.name == deployment.name and d.id != deployment.id for d in self.deployments.values()):
            raise DeploymentExists(deployment.name)
        was = self.deployments.get(deployment.id)
        created = was.created if was is not None else deployment.created
        self.deployments[deployment.id] = msgspec.structs.replace(deployment, created=created)
        self.deployment_changes += 1

    async def list_deployments(self) -> list[StoredDeployment]:
        return sorted(self.deployments.values(), key=lambda d: (d.created, d.id))

    async def delete_deployment(self, deployment_id: str) -> bool:
        if self.deployments.pop(deployment_id, None) is None:
            return False
        self.deployment_changes += 1
        return True

    async def deployments_version(self) -> int:
        return self.deployment_changes

    async def put_holds(self, process: str, holds: Mapping[str, int], now_us: int, stale_us: int) -> None:
        if self.fail:
            raise StoreDown("the fake store is down")
        self.holds = {k: v for k, v in self.holds.items() if k[0] != process and v[1] >= stale_us}
        self.holds.update(((process, key_id), (tokens, now_us)) for key_id, tokens in holds.items())

    async def other_holds(self, process: str, since_us: int) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for (who, key_id), (tokens, updated) in self.holds.items():
            if who != process and updated >= since_us:
                out[key_id] += tokens
        return dict(out)

    async def close(self) -> None:
        pass
