"""Raw HTTP/1.1 on loopback for the production tests: write a request, read the status line and headers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.support.fake import USER_HI


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

