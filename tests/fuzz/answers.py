"""What an answer to a fuzzed request may be, on serve and on the gateway alike.

`check(server, method path, body)` sends it to a live server (`live.Live`,
`live.LiveGateway`) and asserts: never a 5xx, nothing logged at ERROR, no
traceback in the body; a 4xx is OpenAI's exact error envelope (Anthropic's
on /v1/messages*) and not a server error's type; a 200 is JSON, or a
stream that parses cleanly, ends the way its API ends, and carries no
in-band server error.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import event

from tests.fuzz.live import Live, LiveGateway
from tests.support import sse

SERVER_ERROR_TYPES = {"internal_error", "api_error", "service_unavailable", "timeout_error", "overloaded_error"}


def assert_error(status: int, body: bytes, anthropic: bool) -> None:
    data = json.loads(body)
    if anthropic:
        assert set(data) == {"type", "error"} and data["type"] == "error", data
        assert set(data["error"]) == {"type", "message"}, data
    else:
        assert list(data) == ["error"], data
        assert set(data["error"]) == {"message", "type", "param", "code"}, data
        assert data["error"]["param"] is None or isinstance(data["error"]["param"], str), data
    assert isinstance(data["error"]["message"], str) and data["error"]["message"], data
    assert data["error"]["type"] not in SERVER_ERROR_TYPES, data


def assert_stream(body: bytes, kind: str) -> None:
    frames, problems = sse.parse(body)
    assert problems == [], problems
    payloads = [f.json() for f in frames if f.data is not None and not f.is_done]
    for p in payloads:
        err = p.get("error") if isinstance(p, dict) else None
        assert not (isinstance(err, dict) and err.get("type") in SERVER_ERROR_TYPES), p
    last = [f for f in frames if not f.is_comment][-1]
    if kind == "chunks":
        assert last.is_done, last
    elif kind == "responses":
        assert last.event in ("response.completed", "response.incomplete"), last
    else:
        assert last.event == "message_stop", last


def check(
    server: Live | LiveGateway, path: str, body: bytes | None, *, kind: str = "json", anthropic: bool = False,
    method: str = "POST", headers: dict[str, str] | None = None,
) -> int:
    """The status, once the answer passed every check."""
    before = len(server.errors)
    status, ctype, raw = server.request(method, path, body, headers)
    where = f"{method} {path} with the body {(body or b'')[:3000]!r}" + (f" and the headers {headers!r}" if headers else "")
    event(f"{status} {ctype.split(';')[0]}")
    assert status < 500, f"{status} {raw[:500]!r} for {where}"
    assert server.errors[before:] == [], f"logged {server.errors[before:]} for {where}"
    assert b"Traceback" not in raw and b'File "' not in raw, where
    if status >= 400:
        assert ctype.startswith("application/json"), (ctype, where)
        assert_error(status, raw, anthropic)
        error = json.loads(raw)["error"]
        event(f"{status} {error.get('code') or error['type']}")
    elif ctype.startswith("text/event-stream"):
        assert kind != "json", where
        assert_stream(raw, kind)
    else:
        assert ctype.startswith("application/json"), (ctype, where)
        data: Any = json.loads(raw)
        err = data.get("error") if isinstance(data, dict) else None  # an error after an early 200, or a failed Response
        assert err is None or err.get("type") not in SERVER_ERROR_TYPES, (data, where)
    return status
