"""What the ledger holds and answers: the record, the two queries, their answers, the cursor. Sans-IO.

A record's time is the arrival in integer microseconds (UTC), exact in every store. Requests are listed
newest first by (`ts_us`, `seq`); the cursor "<ts_us>_<seq>" starts the next page strictly below, so
each record comes once. Usage sums token columns (null as 0) by deployment, key and UTC day or month.
`record_id` (`new_record_id`: a random per-process prefix and a counter) is unique per record, unlike a
request id; stores keep it once, so a batch written twice stores nothing twice (older records: null).
`replicas` (every replica the request's attempts went to, in order) is a JSON array in the SQL stores'
text column (`row` / `record_of`); `migrations` the times its stream moved on (both null before migration 7).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from itertools import count
from typing import Literal

import msgspec

from streamproxy.errors import InvalidRequest

_ID_PREFIX = os.urandom(8).hex()
_ids = count()


def new_record_id() -> str:
    """32 hex digits: this process's random prefix and a counter."""
    return f"{_ID_PREFIX}{next(_ids):016x}"


def _reseed() -> None:
    """A forked child makes ids of its own, not its parent's next ones."""
    global _ID_PREFIX, _ids
    _ID_PREFIX = os.urandom(8).hex()
    _ids = count()


os.register_at_fork(after_in_child=_reseed)


class LedgerRecord(msgspec.Struct, kw_only=True):
    """One request that reached the gateway."""

    record_id: str | None = msgspec.field(default_factory=new_record_id)  # unique per record; None: before migration 5
    ts_us: int  # arrival, µs since the epoch (UTC)
    request_id: str
    deployment: str | None  # the deployment's name; None when the request named none that exists
    replica: str | None  # the replica's URL it went to (the last one tried)
    key_id: str | None  # the API key's id (never the key); None when the gateway has no keys
    route: str  # the API path the replica is asked, e.g. /v1/chat/completions
    status: int  # the status the client got (499: it left before any response)
    error_code: str | None = None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_source: str | None = None  # "billed": the replica's usage; "counted": the gateway's count
    ttft_ms: float | None = None
    duration_ms: float = 0.0
    # The gateway's (migration 7): every replica its attempts went to, in order (failover before the first
    # byte, then each move of its stream; `replica` is the last), and how often its stream moved on.
    replicas: list[str] | None = None
    migrations: int | None = None


COLUMNS = tuple(LedgerRecord.__struct_fields__)
_REPLICAS = COLUMNS.index("replicas")
_encode_replicas = msgspec.json.Encoder().encode
_decode_replicas = msgspec.json.Decoder(list[str]).decode


def row(record: LedgerRecord) -> tuple[object, ...]:
    """The record as a tuple in `COLUMNS` order (what the SQL stores insert; `replicas` as JSON text)."""
    values = [getattr(record, name) for name in COLUMNS]
    if record.replicas is not None:
        values[_REPLICAS] = _encode_replicas(record.replicas).decode()
    return tuple(values)


def record_of(values: tuple[object, ...]) -> LedgerRecord:
    """A stored row (`COLUMNS` order) as its record."""
    fields = dict(zip(COLUMNS, values))
    replicas = fields["replicas"]
    if isinstance(replicas, str):
        fields["replicas"] = _decode_replicas(replicas)
    return LedgerRecord(**fields)  # type: ignore[arg-type]


class RequestPage(msgspec.Struct, kw_only=True):
    """GET /v1/deployments/{deployment}/requests: newest first."""

    data: list[LedgerRecord]
    has_more: bool
    next_cursor: str | None  # pass as `cursor` for the next page; None on the last one
    object: Literal["list"] = "list"


class UsageRow(msgspec.Struct, kw_only=True):
    """Sums over one group; a dimension not grouped by is null."""

    deployment: str | None = None
    key_id: str | None = None
    period: str | None = None  # "2026-12-01" (day) or "2026-12" (month), UTC
    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0  # prompt + completion


class UsageReport(msgspec.Struct, kw_only=True):
    """GET /v1/usage: `data` ordered by period, deployment, key."""

    data: list[UsageRow]
    start: int  # the range, unix seconds: start <= time < end
    end: int
    group_by: list[str]
    object: Literal["list"] = "list"


Dimension = Literal["deployment", "key", "day", "month"]
DIMENSIONS: tuple[Dimension, ...] = ("deployment", "key", "day", "month")


@dataclass(frozen=True, slots=True)
class Cursor:
    ts_us: int
    seq: int

    def encode(self) -> str:
        return f"{self.ts_us}_{self.seq}"

    @staticmethod
    def decode(text: str) -> Cursor:
        ts, sep, seq = text.partition("_")
        if sep and ts.isdigit() and seq.isdigit() and len(text) < 48:
            return Cursor(int(ts), int(seq))
        raise InvalidRequest("`cursor` is not one this API returned (use `next_cursor` as it is)", param="cursor",
                             code="invalid_cursor")


@dataclass(frozen=True, slots=True)
class RequestQuery:
    """Records of one deployment, newest first: start_us <= ts_us < end_us, and the filters given."""

    deployment: str
    start_us: int = 0
    end_us: int = 2**62
    key_id: str | None = None
    status: int | None = None  # an exact status, or with `status_class`
    status_class: int | None = None  # 2, 4, 5: 2xx, 4xx, 5xx
    limit: int = 100
    cursor: Cursor | None = None


@dataclass(frozen=True, slots=True)
class UsageQuery:
    start_us: int
    end_us: int
    group_by: tuple[Dimension, ...] = ("deployment", "key", "day")
    deployment: str | None = None
    key_id: str | None = None

    @property
    def period(self) -> Literal["day", "month"] | None:
        return "day" if "day" in self.group_by else "month" if "month" in self.group_by else None


def period_of(ts_us: int, period: Literal["day", "month"]) -> str:
    """The UTC day ("2026-12-01") or month ("2026-12") of a time, as every store writes it."""
    when = dt.datetime.fromtimestamp(ts_us // 1_000_000, dt.UTC)
    return when.strftime("%Y-%m-%d" if period == "day" else "%Y-%m")


def usage_row(deployment: str | None, key_id: str | None, period: str | None, requests: int, prompt: int, cached: int,
              completion: int) -> UsageRow:
    return UsageRow(deployment=deployment, key_id=key_id, period=period, requests=requests, prompt_tokens=prompt,
                    cached_prompt_tokens=cached, completion_tokens=completion, total_tokens=prompt + completion)


def sort_usage(rows: list[UsageRow]) -> list[UsageRow]:
    return sorted(rows, key=lambda r: (r.period or "", r.deployment or "", r.key_id or ""))
