"""TLS for `serve` with vLLM's flags: `--ssl-certfile`/`--ssl-keyfile`, `--ssl-ca-certs`,
`--ssl-cert-reqs` (0 none, 1 optional, 2 required: mutual TLS), `--ssl-ciphers`, and
`--enable-ssl-refresh`.

`server_context` builds the site's `ssl.SSLContext` as uvicorn builds vLLM's, at start-up (cli.py), so
a bad file stops the start before the engine loads. `Refresher` checks the files' mtimes every
`REFRESH_INTERVAL` s and reloads a changed chain into the same context: new connections get it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl

from streamproxy.config import Settings

log = logging.getLogger("streamproxy.tls")

REFRESH_INTERVAL = 2.0


class TLSError(ValueError):
    pass


def enabled(settings: Settings) -> bool:
    return bool(settings.ssl_certfile or settings.ssl_keyfile)


def server_context(settings: Settings) -> ssl.SSLContext | None:
    """The context for `settings`' TLS flags (None: plain HTTP); TLSError names what is wrong."""
    if not enabled(settings):
        for flag, value in (("--ssl-ca-certs", settings.ssl_ca_certs), ("--ssl-ciphers", settings.ssl_ciphers)):
            if value:
                raise TLSError(f"{flag} needs --ssl-certfile (and --ssl-keyfile): TLS is off without a certificate")
        if settings.ssl_cert_reqs:
            raise TLSError("--ssl-cert-reqs needs --ssl-certfile (and --ssl-keyfile): TLS is off without a certificate")
        return None
    if not settings.ssl_certfile:
        raise TLSError("--ssl-keyfile needs --ssl-certfile")
    try:
        reqs = ssl.VerifyMode(settings.ssl_cert_reqs)
    except ValueError:
        raise TLSError(f"--ssl-cert-reqs must be 0 (none), 1 (optional) or 2 (required), not {settings.ssl_cert_reqs}") from None
    if reqs != ssl.CERT_NONE and not settings.ssl_ca_certs:
        raise TLSError("--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs (the CAs client certificates must chain to)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _load(ctx, settings)
    ctx.verify_mode = reqs
    if settings.ssl_ciphers:
        try:
            ctx.set_ciphers(settings.ssl_ciphers)
        except ssl.SSLError as exc:
            raise TLSError(f"--ssl-ciphers {settings.ssl_ciphers!r}: {exc}") from None
    return ctx


def _load(ctx: ssl.SSLContext, settings: Settings) -> None:
    assert settings.ssl_certfile is not None
    try:
        ctx.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise TLSError(f"--ssl-certfile/--ssl-keyfile could not be loaded: {exc}") from None
    if settings.ssl_ca_certs:
        try:
            ctx.load_verify_locations(settings.ssl_ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise TLSError(f"--ssl-ca-certs could not be loaded: {exc}") from None


class Refresher:
    """--enable-ssl-refresh: reload the certificate files into `ctx` when one of them changes."""

    def __init__(self, ctx: ssl.SSLContext, settings: Settings) -> None:
        self.ctx = ctx
        self.settings = settings
        self.paths = [p for p in (settings.ssl_certfile, settings.ssl_keyfile, settings.ssl_ca_certs) if p]
        self.seen = self._mtimes()
        self.reloads = 0

    def _mtimes(self) -> list[float]:
        out = []
        for path in self.paths:
            try:
                out.append(os.stat(path).st_mtime)
            except OSError:
                out.append(-1.0)
        return out

    def check(self) -> bool:
        """Reload if a file changed since the last look; whether it did."""
        now = self._mtimes()
        if now == self.seen:
            return False
        self.seen = now
        try:
            _load(self.ctx, self.settings)
        except TLSError as exc:  # a half-written file: keep serving the old one, try again next time
            log.warning("TLS certificate refresh failed (the previous one stays): %s", exc)
            self.seen = []
            return False
        self.reloads += 1
        log.info("TLS certificate files changed: reloaded")
        return True

    async def run(self, interval: float = REFRESH_INTERVAL) -> None:
        while True:
            await asyncio.sleep(interval)
            self.check()
