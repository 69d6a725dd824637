"""TLS to the replicas: an `ssl.SSLContext` per deployment for its https:// upstreams.

`contexts(config)` builds them once at start: a deployment's `tls:` or else `upstream.tls:`, one context
per distinct setting; a file that cannot be read is a `ConfigError` naming it. They verify as a browser
does (`ssl.create_default_context`); `verify: false` turns both checks off. wire.py passes the context
and name (`ClientTLS`) to `loop.create_connection`; a failed handshake is `UpstreamClosed(tls=True)`.
"""

from __future__ import annotations

import ssl

from streamproxy.gateway.config import ConfigError, Deployment, GatewayConfig, UpstreamTLS


class ClientTLS:
    """What connecting to one deployment's https:// replicas needs."""

    __slots__ = ("context", "server_name")

    def __init__(self, context: ssl.SSLContext, server_name: str | None) -> None:
        self.context = context
        self.server_name = server_name  # None: the URL's host


def client_context(tls: UpstreamTLS, where: str) -> ssl.SSLContext:
    """The context for one `tls:` setting; `where` names it in errors (e.g. "deployment 'x': `tls")."""
    try:
        ctx = ssl.create_default_context(cafile=tls.ca_file) if tls.ca_file else ssl.create_default_context()
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}.ca_file`: cannot load {tls.ca_file!r}: {_reason(exc)}") from None
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.cert_file is not None:
        try:
            ctx.load_cert_chain(tls.cert_file, tls.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{where}.cert_file`/`key_file`: cannot load {tls.cert_file!r} with {tls.key_file!r}: {_reason(exc)}") from None
    return ctx


def _reason(exc: OSError | ssl.SSLError) -> str:
    return getattr(exc, "reason", None) or exc.strerror or str(exc)


def setting(deployment: Deployment, config: GatewayConfig) -> UpstreamTLS:
    return deployment.tls if deployment.tls is not None else config.upstream.tls


def contexts(config: GatewayConfig) -> dict[str, ClientTLS]:
    """By deployment name and id: how to reach its https:// upstreams (only deployments that have one)."""
    built: dict[UpstreamTLS, ClientTLS] = {}
    out: dict[str, ClientTLS] = {}
    for d in config.deployments:
        if not any(url.startswith("https://") for url in d.upstreams):
            continue
        tls = setting(d, config)
        ctx = built.get(tls)
        if ctx is None:
            where = f"deployment {d.name!r}: `tls" if d.tls is not None else "gateway config: `upstream.tls"
            ctx = built[tls] = ClientTLS(client_context(tls, where), tls.server_name)
        out[d.name] = out[d.id] = ctx
    return out
