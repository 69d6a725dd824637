"""The query APIs' parameters -> `RequestQuery` / `UsageQuery`; a bad one is a 400 naming it. Sans-IO.

Times (`start`, `end`) are unix seconds (`1764547200`, `1764547200.5`) or
RFC 3339 / ISO 8601 (`2026-12-01`, `2026-12-01T10:00:00Z`; no zone: UTC);
`start` is inclusive, `end` exclusive. Durations (`7d`, `12h`, `30m`, `90s`)
are for the CLI's `--since`. A parameter the API does not know is a 400 too
(a misspelt filter would otherwise silently widen the answer).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping

from streamproxy.errors import InvalidRequest
from streamproxy.ledger.records import DIMENSIONS, Cursor, Dimension, RequestQuery, UsageQuery

MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
DEFAULT_USAGE_DAYS = 30
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_STATUS_CLASS = re.compile(r"([1-5])xx")

REQUESTS_PARAMS = ("start", "end", "key_id", "status", "limit", "cursor")
USAGE_PARAMS = ("start", "end", "group_by", "deployment", "key_id")


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_parameter")


def timestamp_us(value: str, param: str) -> int:
    """Unix seconds or an ISO 8601 date/time -> µs since the epoch."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise _bad(param, f"`{param}` must be unix seconds or an ISO 8601 date or time, not {value!r}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        return int(when.timestamp()) * 1_000_000 + when.microsecond
    if not 0 <= seconds < 2**62 / 1e6 or seconds != seconds:
        raise _bad(param, f"`{param}` is out of range: {value!r}")
    return int(round(seconds * 1_000_000))


def duration_s(value: str, param: str) -> float:
    """`7d`, `12h`, `30m`, `90s`, `2w` (or a plain number of seconds) -> seconds."""
    text = value.strip().lower()
    match = _DURATION.fullmatch(text)
    if match:
        return float(match.group(1)) * _UNITS[match.group(2)]
    try:
        seconds = float(text)
    except ValueError:
        raise _bad(param, f"`{param}` must be a duration like 7d, 12h, 30m or 90s, not {value!r}") from None
    if seconds < 0:
        raise _bad(param, f"`{param}` must not be negative")
    return seconds


def _unknown(params: Mapping[str, str], known: tuple[str, ...]) -> None:
    for name in params:
        if name not in known:
            raise _bad(name, f"unknown parameter `{name}`; this route takes {', '.join(known)}")


def _range(params: Mapping[str, str], now_us: int, default_start_us: int) -> tuple[int, int]:
    start = timestamp_us(params["start"], "start") if "start" in params else default_start_us
    end = timestamp_us(params["end"], "end") if "end" in params else now_us + 1
    if start >= end:
        raise _bad("end", "`end` must be later than `start`")
    return start, end


def _text(params: Mapping[str, str], name: str) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if not value or len(value) > 256:
        raise _bad(name, f"`{name}` must be a non-empty string of at most 256 characters")
    return value


def requests_query(deployment: str, params: Mapping[str, str], now_us: int) -> RequestQuery:
    _unknown(params, REQUESTS_PARAMS)
    start, end = _range(params, now_us, 0)
    status: int | None = None
    status_class: int | None = None
    if "status" in params:
        text = params["status"].strip().lower()
        found = _STATUS_CLASS.fullmatch(text)
        if found:
            status_class = int(found.group(1))
        elif text.isdigit() and 100 <= int(text) <= 599:
            status = int(text)
        else:
            raise _bad("status", f"`status` must be a status (429) or a class (2xx, 4xx, 5xx), not {params['status']!r}")
    limit = DEFAULT_LIMIT
    if "limit" in params:
        text = params["limit"].strip()
        if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
            raise _bad("limit", f"`limit` must be an integer from 1 to {MAX_LIMIT}, not {params['limit']!r}")
        limit = int(text)
    cursor = Cursor.decode(params["cursor"]) if "cursor" in params else None
    return RequestQuery(deployment=deployment, start_us=start, end_us=end, key_id=_text(params, "key_id"), status=status,
                        status_class=status_class, limit=limit, cursor=cursor)


def group_by(text: str) -> tuple[Dimension, ...]:
    dims: list[Dimension] = []
    for part in (p.strip().lower() for p in text.split(",")):
        name = "key" if part == "key_id" else part
        if not part:
            continue
        if name not in DIMENSIONS:
            raise _bad("group_by", f"`group_by` takes deployment, key, day and month (comma-separated), not {part!r}")
        if name not in dims:
            dims.append(name)  # checked against DIMENSIONS
    if "day" in dims and "month" in dims:
        raise _bad("group_by", "`group_by` takes day or month, not both")
    return tuple(dims)


def usage_query(params: Mapping[str, str], now_us: int) -> UsageQuery:
    _unknown(params, USAGE_PARAMS)
    start, end = _range(params, now_us, now_us - DEFAULT_USAGE_DAYS * 86400 * 1_000_000)
    dims = group_by(params["group_by"]) if "group_by" in params else ("deployment", "key", "day")
    return UsageQuery(start_us=start, end_us=end, group_by=dims, deployment=_text(params, "deployment"),
                      key_id=_text(params, "key_id"))
