"""Record what a Python client library really received on the wire.

The client libraries parse JSON and SSE themselves and hand back objects, so
the raw bytes are taken where they enter the library: an httpx transport
that wraps the real one and tees every response body into an `Exchange` as
the library reads it. Give it to a library as its http client:

    wire = Wire()
    openai.OpenAI(base_url=..., http_client=wire.client())        # sync
    openai.AsyncOpenAI(base_url=..., http_client=wire.async_client())

The client still talks straight to the server (no proxy in between), and
only what the library actually read is recorded (a library that stops at
`[DONE]` and closes the stream is recorded up to there).

openai>=3 is built on `httpx2` (httpx's API under another name), openai<3
on `httpx`: the transports are built from whichever module the installed
SDK uses (`http_module()`), and LangChain follows the SDK the same way.
Depends only on that module: the LlamaIndex client runs in its own
virtualenv (tests/compat/llamaindex/, openai<3) and imports this module too;
it prints `Wire.dump()` and the test side rebuilds the exchanges with
`Exchange.load`.
"""

from __future__ import annotations

import base64
import importlib
import re
from collections.abc import AsyncIterator, Iterator
from functools import cache
from typing import Any


def http_module() -> Any:
    """`httpx2` for openai>=3, else `httpx`: what the SDK's http_client must be."""
    import openai

    major = re.match(r"\D*(\d+)", openai.__version__)
    return importlib.import_module("httpx2" if major and int(major.group(1)) >= 3 else "httpx")


class Exchange:
    """One request and the response bytes the client consumed."""

    def __init__(self, method: str, url: str, request_body: bytes) -> None:
        self.method = method
        self.url = url
        self.request_body = request_body
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.complete = False

    @property
    def path(self) -> str:
        return re.sub(r"^[a-z]+://[^/]+", "", self.url).split("?")[0]

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip()

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "url": self.url,
            "request_body": base64.b64encode(self.request_body).decode(),
            "status": self.status,
            "headers": self.headers,
            "body": base64.b64encode(self.body).decode(),
            "complete": self.complete,
        }

    @classmethod
    def load(cls, data: dict[str, Any]) -> Exchange:
        ex = cls(data["method"], data["url"], base64.b64decode(data["request_body"]))
        ex.status = data["status"]
        ex.headers = {k.lower(): v for k, v in data["headers"].items()}
        ex.body = base64.b64decode(data["body"])
        ex.complete = data.get("complete", True)
        return ex

    def __repr__(self) -> str:
        return f"<Exchange {self.method} {self.path} {self.status} {len(self.body)} bytes>"


@cache
def _transports(httpx: Any) -> tuple[type, type]:
    """(sync, async) recording transport classes built on `httpx` (or httpx2)."""

    def _start(request: httpx.Request, response: httpx.Response, log: list[Exchange]) -> Exchange:
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = b""
        ex = Exchange(request.method, str(request.url), body)
        ex.status = response.status_code
        ex.headers = {k.lower(): v for k, v in response.headers.items()}
        log.append(ex)
        return ex

    class _Tee(httpx.SyncByteStream):
        def __init__(self, inner: Any, ex: Exchange) -> None:
            self.inner = inner
            self.ex = ex

        def __iter__(self) -> Iterator[bytes]:
            for piece in self.inner:
                self.ex.body += piece
                yield piece
            self.ex.complete = True

        def close(self) -> None:
            self.inner.close()

    class _AsyncTee(httpx.AsyncByteStream):
        def __init__(self, inner: Any, ex: Exchange) -> None:
            self.inner = inner
            self.ex = ex

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for piece in self.inner:
                self.ex.body += piece
                yield piece
            self.ex.complete = True

        async def aclose(self) -> None:
            await self.inner.aclose()

    class RecordingTransport(httpx.BaseTransport):
        def __init__(self, log: list[Exchange]) -> None:
            self.inner = httpx.HTTPTransport()
            self.log = log

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = self.inner.handle_request(request)
            ex = _start(request, response, self.log)
            return httpx.Response(
                response.status_code, headers=response.headers, stream=_Tee(response.stream, ex),
                extensions=response.extensions, request=request,
            )

        def close(self) -> None:
            self.inner.close()

    class AsyncRecordingTransport(httpx.AsyncBaseTransport):
        def __init__(self, log: list[Exchange]) -> None:
            self.inner = httpx.AsyncHTTPTransport()
            self.log = log

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            response = await self.inner.handle_async_request(request)
            ex = _start(request, response, self.log)
            return httpx.Response(
                response.status_code, headers=response.headers, stream=_AsyncTee(response.stream, ex),
                extensions=response.extensions, request=request,
            )

        async def aclose(self) -> None:
            await self.inner.aclose()

    return RecordingTransport, AsyncRecordingTransport


class Wire:
    """A log of exchanges plus httpx clients that write to it."""

    def __init__(self, httpx: Any = None) -> None:
        self.exchanges: list[Exchange] = []
        self.httpx = httpx or http_module()

    def client(self, timeout: float = 120.0) -> Any:
        sync, _ = _transports(self.httpx)
        return self.httpx.Client(transport=sync(self.exchanges), timeout=timeout)

    def async_client(self, timeout: float = 120.0) -> Any:
        _, asynchronous = _transports(self.httpx)
        return self.httpx.AsyncClient(transport=asynchronous(self.exchanges), timeout=timeout)

    def dump(self) -> list[dict[str, Any]]:
        return [ex.to_json() for ex in self.exchanges]
