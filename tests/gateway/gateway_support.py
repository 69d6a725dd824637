"""What the gateway's tests share: the deployment's names, request bodies, the replica's
answer renamed to the gateway's, the gateway's access-log lines, metric samples, raw HTTP."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict
from prometheus_client import REGISTRY

from tests.support.fake import USER_HI

DEPLOYMENT = "support-bot"  # what clients send as `model`
DEPLOYMENT_ID = "dep-7f3a"
SERVED = "Qwen/Qwen3-8B"  # the replicas' name for it


def chat(model: str | None = DEPLOYMENT, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": USER_HI, **extra}
    if model is not None:
        body["model"] = model
    return body


def renamed(raw: bytes) -> bytes:
    """A replica's bytes as the gateway relays them: its model name replaced by the deployment's."""
    return raw.replace(b'"model":"' + SERVED.encode() + b'"', b'"model":"' + DEPLOYMENT.encode() + b'"')


def timeless(raw: bytes) -> bytes:
    """`created` (a clock) and the creation times of Responses/Anthropic events fixed, so two answers compare."""
    return re.sub(rb'"(created|created_at)":\d+', rb'"\1":0', raw)


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], **headers: str) -> tuple[int, CIMultiDict[str], bytes]:
    """Status, headers (case-insensitive) and the whole body."""
    async with session.post(url, json=body, headers=headers) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


def gateway_lines(lines: list[str]) -> list[dict[str, Any]]:
    """The gateway's access-log lines among the captured ones (the in-process replicas log to the
    same logger; only the gateway's relayed requests have a `deployment`)."""
    parsed = [json.loads(line) for line in lines]
    return [p for p in parsed if "deployment" in p]


def line_for(lines: list[str], request_id: str) -> dict[str, Any]:
    found = [p for p in gateway_lines(lines) if p["request_id"] == request_id]
    assert len(found) == 1, (request_id, lines)
    return found[0]


def sample(name: str, **labels: str) -> float | None:
    """A metric's value in this process's registry (the in-process gateway's)."""
    return REGISTRY.get_sample_value(name, labels)


def raw_request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def read_http_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    """A stub replica's view of one request: request line, headers (lower-case), body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return lines[0], headers, body


def chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def fits(path: str, method: str, status: int, data: Any) -> None:
    """`data` (a JSON answer of `method path` with `status`, the path as sent) is what the gateway's
    GET /openapi.json documents for it (the status's own entry, else 4XX/5XX); jsonschema.ValidationError."""
    import jsonschema

    from streamproxy.gateway import openapi

    doc = json.loads(openapi.document())
    template = next(t for t in doc["paths"] if re.fullmatch(re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(t)), path))
    responses = doc["paths"][template][method]["responses"]
    found = responses.get(str(status)) or responses[f"{status // 100}XX"]
    schema = found["content"]["application/json"]["schema"]
    jsonschema.Draft202012Validator({**doc, **schema}).validate(data)


# Stream migration's tests (test_migration_serve.py, test_migration_blocks.py): two replicas, the first
# listed first, and a stub in front of the first that dies after its k-th event.
UPSTREAM = {"consecutive_errors": 100_000, "prefix_affinity": False, "rendezvous": False}  # the first listed first


def deployment(*urls: str) -> list[dict[str, Any]]:
    return [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": list(urls),
             "migration": {"stream_idle_timeout": 0}}]


class Dying:
    """The replica's stream, relayed until its `cut`-th event (None: whole); `events` it had in all."""

    def __init__(self, target: str, *, vllm: bool = False) -> None:
        self.target = target
        self.vllm = vllm  # plays a vLLM replica: its Responses and Messages streams carry no ids and say nothing
        self.cut: int | None = None
        self.events = 0
        self.bodies: list[dict[str, Any]] = []
        self.stub: Any = None  # the `stub` it plays

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, headers, body = self.stub.requests[-1]
        self.bodies.append(orjson.loads(body))
        if self.vllm and "/v1/chat/" not in line:
            body = orjson.dumps({k: v for k, v in orjson.loads(body).items() if k != "return_token_ids"})
        ours = {"Content-Type": "application/json", **{k: v for k, v in headers.items() if k.lower() == "x-request-id"}}
        async with aiohttp.ClientSession() as session:
            async with session.post(self.target + line.split()[1], data=body, headers=ours) as r:
                raw = await r.read()
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                for name in ("X-Request-Id",) if self.vllm and "/v1/chat/" not in line else ("Streamproxy-Continuation", "X-Request-Id"):
                    if name in r.headers:
                        head += f"{name}: {r.headers[name]}\r\n".encode()
        events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
        self.events = len(events)
        writer.write(head + b"\r\n")
        for event in events[: self.cut]:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        if self.cut is None:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
