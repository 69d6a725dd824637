"""API keys made through the admin API, kept in the ledger's store: their structs and rules. Sans-IO.

A key's secret (`sk-sp-` + 32 random bytes, URL-safe base64) is shown once,
in the answer to `POST /v1/keys`; the store keeps its SHA-256 (a secret of
256 random bits needs no slow hash: nothing can be guessed), which is also
how a request's key is looked up. A key may carry `rpm` and `tpm` (per
gateway process, as a config key's) and a token budget per UTC day or month
(`budget_tokens`, `budget_period`), counted from the ledger's records of all
processes: prompt + completion tokens since the period began.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import os
import re
from typing import Literal

import msgspec

from streamproxy.errors import InvalidRequest

PREFIX = "sk-sp-"
_ID = re.compile(r"[A-Za-z0-9._:\-]{1,64}")
MAX_DEPLOYMENTS = 256


class KeyExists(Exception):
    """`LedgerStore.put_key`: a key with this id (or this secret) is there already."""


class StoredKey(msgspec.Struct, kw_only=True):
    """A key as the store holds it (never the secret)."""

    id: str
    hash: str  # sha256 hex of the secret
    deployments: list[str]  # names or ids, or ["*"]
    rpm: int = 0
    tpm: int = 0
    budget_tokens: int | None = None
    budget_period: Literal["day", "month"] | None = None
    created: int = 0  # unix seconds
    revoked: int | None = None  # unix seconds; a revoked key is refused at once


class KeyCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /v1/keys."""

    deployments: list[str]  # the deployments it may use (names or ids), or ["*"]
    id: str | None = None  # default: key-<12 hex>
    rpm: int = 0  # requests per minute, per gateway process (0: no limit)
    tpm: int = 0  # prompt + completion tokens per minute, per gateway process
    budget_tokens: int | None = None  # prompt + completion tokens per budget_period, across processes
    budget_period: Literal["day", "month"] | None = None


class KeyInfo(msgspec.Struct, kw_only=True):
    """A key as GET /v1/keys shows it: never the secret."""

    id: str
    deployments: list[str]
    rpm: int
    tpm: int
    budget_tokens: int | None
    budget_period: Literal["day", "month"] | None
    created: int
    revoked: int | None = None  # unix seconds: refused since
    source: Literal["api", "config"] = "api"
    object: Literal["api_key"] = "api_key"


class KeyCreated(msgspec.Struct, kw_only=True):
    """POST /v1/keys: the key, with its secret this once."""

    id: str
    secret: str
    deployments: list[str]
    rpm: int
    tpm: int
    budget_tokens: int | None
    budget_period: Literal["day", "month"] | None
    created: int
    object: Literal["api_key"] = "api_key"


class KeyList(msgspec.Struct, kw_only=True):
    data: list[KeyInfo]
    object: Literal["list"] = "list"


class KeyDeleted(msgspec.Struct, kw_only=True):
    id: str
    deleted: bool = True
    object: Literal["api_key"] = "api_key"


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_parameter")


def parse_create(body: bytes, known_deployments: set[str]) -> KeyCreate:
    """The request body, checked; a 400 naming the field otherwise."""
    try:
        req = msgspec.json.decode(body, type=KeyCreate)
    except msgspec.ValidationError as exc:
        text = str(exc)
        found = re.search(r"at `\$\.(\w+)", text) or re.search(r"field `(\w+)`", text)
        raise _bad(found.group(1) if found else None, f"invalid key request: {text}") from None  # type: ignore[arg-type]
    except msgspec.DecodeError:
        raise InvalidRequest("the request body is not valid JSON", code="invalid_json") from None
    if req.id is not None and not _ID.fullmatch(req.id):
        raise _bad("id", "`id` must be 1 to 64 letters, digits or . _ : -")
    if not req.deployments or len(req.deployments) > MAX_DEPLOYMENTS:
        raise _bad("deployments", "`deployments` must name at least one deployment (or \"*\")")
    unknown = [d for d in req.deployments if d != "*" and d not in known_deployments]
    if unknown:
        raise _bad("deployments", f"no deployment named {', '.join(repr(u) for u in unknown)}")
    for name in ("rpm", "tpm"):
        if getattr(req, name) < 0:
            raise _bad(name, f"`{name}` must be 0 (no limit) or a positive number")
    if req.budget_tokens is not None and req.budget_tokens <= 0:
        raise _bad("budget_tokens", "`budget_tokens` must be a positive number of tokens")
    if (req.budget_tokens is None) != (req.budget_period is None):
        param = "budget_period" if req.budget_period is None else "budget_tokens"
        raise _bad(param, "a budget needs both `budget_tokens` and `budget_period` (day or month)")
    return req


def new_secret() -> str:
    return PREFIX + base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_id() -> str:
    return "key-" + os.urandom(6).hex()


def info(key: StoredKey) -> KeyInfo:
    return KeyInfo(id=key.id, deployments=key.deployments, rpm=key.rpm, tpm=key.tpm, budget_tokens=key.budget_tokens,
                   budget_period=key.budget_period, created=key.created, revoked=key.revoked)


def period_start(now: float, period: Literal["day", "month"]) -> tuple[int, int]:
    """(start, end) of the UTC day or month holding `now`, unix seconds."""
    t = dt.datetime.fromtimestamp(now, dt.UTC)
    if period == "day":
        start = t.replace(hour=0, minute=0, second=0, microsecond=0)
        end = start + dt.timedelta(days=1)
    else:
        start = t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = (start + dt.timedelta(days=32)).replace(day=1)
    return int(start.timestamp()), int(end.timestamp())
