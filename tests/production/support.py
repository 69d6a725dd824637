"""Helpers for the production tests: waiting, SSE frames, raw HTTP on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

USER_HI = [{"role": "user", "content": "hi"}]
KEEPALIVE = b": keepalive"
DONE = b"data: [DONE]"


async def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        await asyncio.sleep(interval)


def frames(body: bytes) -> list[bytes]:
    """SSE frames without their blank-line terminator; the body must end on a frame boundary."""
    assert body.endswith(b"\n\n"), body[-120:]
    return body[:-2].split(b"\n\n")


def data_payloads(body: bytes) -> list[Any]:
    """JSON of every data frame before [DONE] (keepalive comments skipped); [DONE] must be last."""
    fs = [f for f in frames(body) if not f.startswith(b":")]
    assert fs[-1] == DONE, fs[-3:]
    return [json.loads(f[6:]) for f in fs[:-1]]


def stream_verdict(body: bytes) -> str:
    """'done' (finish_reason then [DONE]) or 'error' (error event then [DONE]); anything else fails."""
    payloads = data_payloads(body)
    last = payloads[-1]
    if "error" in last:
        assert set(last["error"]) == {"message", "type", "param", "code"}, last
        return "error"
    assert last["choices"] == [] or last["choices"][0]["finish_reason"] is not None, last
    return "done"


def http_request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    for k, v in (headers or {}).items():
        head.append(f"{k}: {v}")
    if body or method == "POST":
        head.append("Content-Type: application/json")
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chat_body(**extra: Any) -> bytes:
    return json.dumps({"messages": USER_HI, **extra}).encode()


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    return status, headers


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    """The whole chunked body; raises IncompleteReadError if the server cut it short."""
    out = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readexactly(2)
