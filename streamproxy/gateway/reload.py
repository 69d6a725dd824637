"""Reloading the gateway's config while it serves (SIGHUP), the way `nginx -s reload` does.

`reload(app, load)`: a file that does not read, parse or validate is refused with one log line and
counted (`streamproxy_gateway_config_reloads_total{outcome="refused"}`), the old config untouched.
Otherwise a new `GatewayState` is built from the current one and swapped in one assignment with no await
between: new requests see it, requests in flight finish on the state they began with. `take_over` starts
new sources and retires removed ones once their last request ends. What only a restart changes is logged
as kept; SIGHUPs during a reload fold into one more after it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

import msgspec
from aiohttp import web

from streamproxy.config import Settings
from streamproxy.errors import ServerShuttingDown
from streamproxy.gateway import metrics as M
from streamproxy.gateway.config import Deployment, GatewayConfig
from streamproxy.gateway.config_file import check
from streamproxy.gateway.state import STATE_KEY, GatewayState

log = logging.getLogger("streamproxy.gateway")

Load = Callable[[], tuple[Settings, GatewayConfig]]

# Settings only a restart changes: the listener, the edge's connection handling, the logs.
RESTART_ONLY = (
    "host", "port", "uds", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "ssl_cert_reqs", "enable_ssl_refresh",
    "max_connections", "client_header_timeout", "client_body_timeout", "keepalive_timeout", "max_header_bytes",
    "max_header_count", "max_body_bytes", "allowed_origins", "allowed_methods", "allowed_headers", "allow_credentials",
    "access_log", "disable_access_log_for_endpoints", "log_level", "drain_timeout",
)
# The gateway config's sections and `upstream:` fields only a restart changes.
RESTART_ONLY_CONFIG = ("ledger", "ledger_writer")
RESTART_ONLY_UPSTREAM = ("connect_timeout", "read_timeout", "keepalive")


def merged(file_config: GatewayConfig, api: dict[str, Deployment]) -> GatewayConfig:
    """The config the gateway serves: the file's, with the admin API's deployments after its own;
    checked as a whole (`ConfigError`: a name used twice, a key naming a deployment that is gone)."""
    if not api:
        return file_config
    config = msgspec.structs.replace(file_config, deployments=[*file_config.deployments, *api.values()])
    check(config)
    return config


def swap(app: web.Application, settings: Settings, file_config: GatewayConfig, api: dict[str, Deployment]) -> tuple[GatewayState, list[str]]:
    """Build the state for `file_config` + `api` from the current one and put it in its place (on the loop,
    nothing awaited in between); the old state's removed deployments retire. Raises before changing anything."""
    current = app[STATE_KEY]
    old = current.state
    if old.inflight.draining:  # the sources are being stopped: none is started now
        raise ServerShuttingDown("the gateway is shutting down: its deployments do not change now")
    new = GatewayState(settings, merged(file_config, api), previous=old)
    new.from_api = set(api)
    current.state, current.file_config, current.api = new, file_config, api  # the swap
    return new, new.take_over(old)


def reload(app: web.Application, load: Load, source: str = "") -> bool:
    """Load and apply the config now; False when refused (logged, counted). Runs on the event loop,
    synchronously: nothing else runs between the check and the swap. The admin API's deployments stay."""
    current = app[STATE_KEY]
    old = current.state
    try:
        if old.inflight.draining:
            raise ServerShuttingDown("the gateway is shutting down")
        settings, file_config = load()
        new, retired = swap(app, settings, file_config, current.api)
    except (Exception, SystemExit) as exc:  # whatever it is, the old config keeps serving
        M.RELOADS.labels("refused").inc()
        where = f"{source}: " if source else ""
        reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"  # ConfigError is one
        log.error("reload refused: %s%s; still serving the previous config", where, " ".join(reason.split()))
        return False
    M.RELOADS.labels("applied").inc()
    config = new.config
    kept = [d.name for d in config.deployments if old.pools.get(d.name) is new.pools[d.name]]
    added = [d.name for d in config.deployments if d.name not in kept]
    log.info(
        "reloaded%s: %d deployments (unchanged: %s; new or changed: %s; removed or replaced: %s), %d keys",
        f" {source}" if source else "", len(config.deployments), ", ".join(kept) or "none", ", ".join(added) or "none",
        ", ".join(retired) or "none", len(config.keys),
    )
    _restart_only(old, new)
    return True


def _restart_only(old: GatewayState, new: GatewayState) -> None:
    changed = [f"--{n.replace('_', '-')}" for n in RESTART_ONLY if getattr(old.settings, n, None) != getattr(new.settings, n, None)]
    changed += [f"`{n}`" for n in RESTART_ONLY_CONFIG if getattr(old.config, n) != getattr(new.config, n)]
    changed += [f"`upstream.{n}`" for n in RESTART_ONLY_UPSTREAM if getattr(old.policy, n) != getattr(new.policy, n)]
    if changed:
        log.warning("reload: %s changed, which only a restart applies: the running values stay", ", ".join(changed))


class Reloader:
    """SIGHUP -> `reload`, on the loop; signals during one reload make one more after it."""

    def __init__(self, app: web.Application, load: Load, source: str = "") -> None:
        self.app, self.load, self.source = app, load, source
        self.pending = False
        self._task: asyncio.Task[None] | None = None

    def install(self) -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.requested)

    def uninstall(self) -> None:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)

    def requested(self) -> None:
        log.info("SIGHUP: reloading the config%s", f" from {self.source}" if self.source else "")
        if self._task is not None and not self._task.done():
            self.pending = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gateway-reload")

    async def _run(self) -> None:
        while True:
            self.pending = False
            await self._once()
            if not self.pending:
                return

    async def _once(self) -> None:
        # `load` reads a file: a small one, read in a thread so a slow disk does not stall the loop.
        try:
            loaded = await asyncio.to_thread(self.load)
        except (Exception, SystemExit) as exc:  # refused below with the reason, on the loop
            error = exc

            def failed() -> tuple[Settings, GatewayConfig]:
                raise error

            reload(self.app, failed, self.source)
        else:
            reload(self.app, lambda: loaded, self.source)
