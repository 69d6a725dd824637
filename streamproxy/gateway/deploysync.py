"""The deployments made through the admin API, followed in the ledger's store: every gateway sharing
it serves another's POST, PATCH and DELETE /v1/deployments within `REFRESH` s, as keyring.py does keys.

Each poll reads `deployments_version`; only when it moved are the deployments listed and checked as at
start (`serveable`), and a changed set applied through the reload swap (`reload.swap`: in-flight work
keeps its state, unchanged deployments their pools). A stored deployment that does not fit here is
refused with one ERROR line per version, the rest applied. A list read while this gateway changed its
deployments or reloaded is dropped and read again, so a stale list never undoes a change made here.
The store down: the deployments served stay, with one warning.
"""

from __future__ import annotations

import logging

import msgspec
from aiohttp import web

from streamproxy.errors import APIError, ServerShuttingDown
from streamproxy.gateway.config import ConfigError, Deployment, GatewayConfig
from streamproxy.gateway.deployadmin import parse
from streamproxy.gateway.poll import StorePoll
from streamproxy.gateway.reload import merged, swap
from streamproxy.gateway.state import STATE_KEY
from streamproxy.gateway.upstream_tls import contexts
from streamproxy.ledger.deployments import StoredDeployment
from streamproxy.ledger.store import LedgerStore

log = logging.getLogger("streamproxy.gateway")

REFRESH = 1.0  # s


def serveable(file_config: GatewayConfig, stored: list[StoredDeployment]) -> tuple[dict[str, Deployment], list[tuple[StoredDeployment, str]]]:
    """The stored deployments this gateway can serve beside its file's, by id in the store's order; and
    those it cannot, with the reason."""
    api: dict[str, Deployment] = {}
    refused: list[tuple[StoredDeployment, str]] = []
    for s in stored:
        try:
            d = parse(msgspec.json.decode(s.spec))
            candidate = {**api, d.id: d}
            merged(file_config, candidate)
            contexts(msgspec.structs.replace(file_config, deployments=[d]))  # its CA files, read here
        except (APIError, ConfigError, msgspec.DecodeError) as exc:
            refused.append((s, str(exc)))
            continue
        api = candidate
    return api, refused


class DeploymentSync:
    def __init__(self, app: web.Application, store: LedgerStore) -> None:
        self.app = app
        self.store = store
        self.seen: int | None = None  # the store's deployments_version last applied
        self._file: GatewayConfig | None = None  # the config file's sections they were checked against
        self._refused: set[tuple[str, str]] = set()  # (id, spec) logged as refused
        self._poll = StorePoll("deployments", "keeping the deployments served", self.refresh, lambda: REFRESH,
                               "gateway-deployment-sync")

    async def load(self) -> None:
        """At start: the store's deployments served beside the file's (a store that cannot be read: the file's only)."""
        try:
            await self.refresh(start=True)
        except Exception as exc:
            log.error("deployments made through the API: the ledger's store cannot be read (%s: %s); serving the file's only "
                      "until it can", type(exc).__name__, exc)
            self._poll.failing = True

    async def refresh(self, start: bool = False) -> bool:
        """Apply the store's deployments if they changed since the last look; True when the served set changed."""
        current = self.app[STATE_KEY]
        before = current.api
        file_config = current.file_config
        version = await self.store.deployments_version()
        if version == self.seen and file_config is self._file:
            return False
        stored = await self.store.list_deployments()
        if current.api is not before or current.file_config is not file_config:  # changed here meanwhile: read again
            return False
        if file_config is not self._file:  # a reload: what it refused may fit now, and is said again if not
            self._refused.clear()
        api, refused = serveable(file_config, stored)
        for s, reason in refused:
            if (s.id, s.spec) not in self._refused:
                self._refused.add((s.id, s.spec))
                log.error("deployment %s (%s) from the ledger's store is not served: %s", s.name, s.id, reason)
        self.seen, self._file = version, file_config
        if api == current.api:
            return False
        old = current.api
        try:
            swap(self.app, current.state.settings, file_config, api)
        except ServerShuttingDown:
            return False
        except Exception as exc:  # each checked above; the whole refused: the deployments served stay until the next change
            log.error("deployments from the ledger's store are not applied (%s: %s); still serving the previous ones",
                      type(exc).__name__, exc)
            return False
        if start:
            log.info("deployments made through the API: %s", ", ".join(f"{d.name} ({d.id})" for d in api.values()))
        else:
            added = [d for k, d in api.items() if k not in old]
            changed = [d for k, d in api.items() if k in old and old[k] != d]
            removed = [d for k, d in old.items() if k not in api]
            log.info("deployments from the ledger's store: added %s; changed %s; removed %s",
                     *(", ".join(f"{d.name} ({d.id})" for d in group) or "none" for group in (added, changed, removed)))
        return True

    def start(self) -> None:
        self._poll.start()

    async def stop(self) -> None:
        await self._poll.stop()
