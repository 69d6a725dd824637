"""A lean closed-loop streaming load generator (asyncio + uvloop, raw HTTP/1.1).

Why not aiohttp's client: on 2 cores the client shares the machine with the
server under test, so every microsecond it spends parsing is taken from the
server. Here each of N workers keeps one keep-alive connection and sends the
same pre-encoded request again and again; the response is read by an
`asyncio.Protocol` that decodes chunked transfer encoding by hand.

Two modes:
- `parse=True`: SSE events are split and JSON-decoded (orjson) to time the
  first text-bearing event (TTFT), the gaps between text-bearing events
  (inter-token latency, per event as vLLM's benchmark_serving does: one event
  may carry several tokens when a server merges), and to read the usage chunk.
- `parse=False`: only bytes and finished responses are counted (the
  fake-engine capacity benchmark, where the client must stay cheap).
Parsed, a record also counts every `data:` event ([DONE] too) and keeps the
usage's prompt and cached tokens. `run_load(raw=...)` also takes a function
giving the next request; `jitter=J` pauses a random 0..J s before each one.

`python -m bench.loadgen --url http://127.0.0.1:8000 -c 64 -n 128` runs it
against any OpenAI-compatible server and prints the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson

PROMPT = "Tell me a long story about a lighthouse keeper who finds a message in a bottle."


def request_body(endpoint: str, model: str, max_tokens: int, *, prompt: str = PROMPT,
                 stream: bool = True, ignore_eos: bool = True, temperature: float = 0.0) -> dict:
    body: dict = {"model": model, "max_tokens": max_tokens, "stream": stream,
                  "temperature": temperature, "ignore_eos": ignore_eos}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def endpoint_path(endpoint: str) -> str:
    return "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"


def build_request(host: str, port: int, path: str, body: dict, api_key: str | None = None) -> bytes:
    payload = orjson.dumps(body)
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n")
    if api_key:
        head += f"Authorization: Bearer {api_key}\r\n"
    return head.encode() + b"\r\n" + payload


@dataclass
class RequestRecord:
    status: int = 0
    sent: float = 0.0
    ttft: float | None = None       # seconds to the first text-bearing event
    itl: list[float] = field(default_factory=list)  # gaps between text-bearing events
    events: int = 0                 # text-bearing events
    sse_events: int = 0             # every `data:` event, [DONE] included
    prompt_tokens: int = 0          # usage.prompt_tokens (0 if absent)
    cached_tokens: int = 0          # usage.prompt_tokens_details.cached_tokens
    tokens: int = 0                 # usage.completion_tokens (0 if absent)
    nbytes: int = 0                 # body bytes after de-chunking
    latency: float = 0.0
    error: str | None = None


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one response at a time."""

    def __init__(self, parse: bool) -> None:
        self.parse = parse
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self.done: asyncio.Future | None = None
        self.rec: RequestRecord | None = None
        self.keep_alive = True
        # The response being read (send() resets them): its head until complete, then its body's framing.
        self.head: bytearray | None = None
        self.buf = b""
        self.left = 0
        self.sse = b""
        self.chunked = False

    # -- asyncio.Protocol ------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self.keep_alive = False
        if self.done is not None and not self.done.done():
            self.rec.error = f"connection lost: {exc}"  # type: ignore[union-attr]
            self.done.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.rec is None:
            return
        if self.head is not None:
            self.head += data
            if self.head[:2] == b"\r\n":  # a late CRLF ending the previous chunked body
                del self.head[:2]
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self._parse_head(bytes(self.head[:end]))
            data = bytes(self.head[end + 4:])
            self.head = None
            if not data:
                return
        if self.chunked:
            self._feed_chunked(data, now)
        else:
            take = data[: self.left]
            self.left -= len(take)
            self._payload(take, now)
            if self.left <= 0:
                self._finish(now)

    # -- request / response ---------------------------------------------
    def send(self, raw: bytes, rec: RequestRecord) -> asyncio.Future:
        self.rec = rec
        self.head = bytearray()
        self.buf = b""        # undecoded chunked bytes
        self.left = 0         # bytes left in the current chunk (or body)
        self.sse = b""        # undelimited SSE text
        self.chunked = False
        self.last = 0.0
        self.done = asyncio.get_running_loop().create_future()
        rec.sent = time.perf_counter()
        transport = self.transport
        if transport is None or transport.is_closing() or not self.keep_alive:
            # The server closed this connection since it was checked (a relay dropping idle
            # connections): a lost request, and the worker reconnects.
            rec.error = "connection lost: closed before the request was sent"
            self.keep_alive = False
            self.done.set_result(None)
            return self.done
        try:
            transport.write(raw)
        except (OSError, RuntimeError) as exc:
            rec.error = f"connection lost: {exc}"
            self.keep_alive = False
            self.done.set_result(None)
        return self.done

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self.rec.status = int(lines[0].split(b" ", 2)[1])  # type: ignore[union-attr]
        self.left = 0
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            k = k.strip().lower()
            v = v.strip().lower()
            if k == b"transfer-encoding" and b"chunked" in v:
                self.chunked = True
            elif k == b"content-length":
                self.left = int(v)
            elif k == b"connection" and v == b"close":
                self.keep_alive = False
        if not self.chunked and self.left == 0:
            self._finish(time.perf_counter())

    def _feed_chunked(self, data: bytes, now: float) -> None:
        buf = self.buf + data if self.buf else data
        pos, n = 0, len(buf)
        while pos < n:
            if self.left > 0:
                end = min(n, pos + self.left)
                self._payload(buf[pos:end], now)
                self.left -= end - pos
                pos = end
                if self.left == 0:
                    self.left = -2  # the CRLF after the chunk data
                continue
            if self.left < 0:  # skip CRLF after data
                skip = min(-self.left, n - pos)
                self.left += skip
                pos += skip
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol].split(b";", 1)[0], 16)
            pos = eol + 2
            if size == 0:  # last chunk; trailers (none expected) end with CRLF
                self.buf = b""
                self._finish(now)
                return
            self.left = size
        self.buf = buf[pos:]

    def _payload(self, data: bytes, now: float) -> None:
        rec = self.rec
        rec.nbytes += len(data)  # type: ignore[union-attr]
        if not self.parse or rec.status != 200:  # type: ignore[union-attr]
            return
        sse = self.sse + data if self.sse else data
        start = 0
        while True:
            end = sse.find(b"\n\n", start)
            if end < 0:
                break
            self._event(sse[start:end], now)
            start = end + 2
        self.sse = sse[start:]

    def _event(self, ev: bytes, now: float) -> None:
        if not ev.startswith(b"data:"):
            return  # comments (keepalives)
        rec = self.rec
        rec.sse_events += 1  # type: ignore[union-attr]
        if ev.startswith(b"data: [DONE]"):
            return
        obj = orjson.loads(ev[5:])
        usage = obj.get("usage")
        if usage:
            rec.tokens = usage.get("completion_tokens") or 0  # type: ignore[union-attr]
            rec.prompt_tokens = usage.get("prompt_tokens") or 0  # type: ignore[union-attr]
            rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0  # type: ignore[union-attr]
        choices = obj.get("choices")
        if not choices:
            if "error" in obj:
                rec.error = str(obj["error"])[:200]  # type: ignore[union-attr]
            return
        c = choices[0]
        text = c.get("text")
        if text is None:
            text = (c.get("delta") or {}).get("content")
        if text:
            if rec.ttft is None:  # type: ignore[union-attr]
                rec.ttft = now - rec.sent  # type: ignore[union-attr]
            else:
                rec.itl.append(now - self.last)  # type: ignore[union-attr]
            self.last = now
            rec.events += 1  # type: ignore[union-attr]

    def _finish(self, now: float) -> None:
        rec = self.rec
        rec.latency = now - rec.sent  # type: ignore[union-attr]
        if rec.status != 200 and rec.error is None:  # type: ignore[union-attr]
            rec.error = f"HTTP {rec.status}"  # type: ignore[union-attr]
        self.rec = None
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


@dataclass
class LoadResult:
    records: list[RequestRecord]
    wall: float
    t_start: float
    t_end: float
    client_cpu: float

    @property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if r.error is None]

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self.records if r.error is not None]


async def _connect(host: str, port: int, parse: bool) -> _Conn:
    loop = asyncio.get_running_loop()
    for attempt in range(20):
        try:
            _, proto = await loop.create_connection(lambda: _Conn(parse), host, port)
            return proto
        except OSError:
            if attempt == 19:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))
    raise AssertionError


async def connect_all(host: str, port: int, n: int, parse: bool) -> list[_Conn]:
    conns: list[_Conn] = []
    for i in range(0, n, 64):  # in batches: a burst of SYNs overflows small backlogs
        conns += await asyncio.gather(*(_connect(host, port, parse) for _ in range(min(64, n - i))))
    return conns


async def run_load(url: str, raw: bytes | Callable[[], bytes], concurrency: int, requests: int = 0, *,
                   duration: float = 0.0, parse: bool = True, conns: list[_Conn] | None = None,
                   on_start=None, jitter: float = 0.0, spread: float = 0.0) -> LoadResult:
    """N workers, closed loop: `requests` in total, or keep going for `duration` s.

    Connections are opened before the clock starts (keep-alive clients), then
    `on_start()` is called (the caller samples CPU counters there).
    `spread` (with `duration`): worker k of N sends its first request k/N x
    `spread` s late, so arrivals are spread over `spread` instead of all workers
    starting together (and, when every request takes about as long, staying in
    step); the clock starts once every worker is going, and only requests sent
    after that count.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    if conns is None:
        conns = await connect_all(host, port, concurrency, parse)
    records: list[RequestRecord] = []
    remaining = requests
    deadline = 0.0

    async def worker(conn: _Conn, delay: float) -> None:
        nonlocal remaining
        if delay:
            await asyncio.sleep(delay)
        while True:
            if duration:
                if time.perf_counter() >= deadline:
                    return
            else:
                if remaining <= 0:
                    return
                remaining -= 1
            if jitter:  # arrive at any phase of an engine's step clock
                await asyncio.sleep(random.uniform(0.0, jitter))
            if not conn.keep_alive or (conn.transport is not None and conn.transport.is_closing()):
                conn = await _connect(host, port, parse)
                conns.append(conn)
            rec = RequestRecord()
            if started:
                records.append(rec)
            await conn.send(raw() if callable(raw) else raw, rec)
            if rec.error and rec.error.startswith("connection lost"):
                conn.keep_alive = False

    spread = spread if duration else 0.0
    started = not spread
    cpu0 = t0 = 0.0

    def start() -> None:
        nonlocal started, cpu0, t0, deadline
        if on_start is not None:
            on_start()
        started = True
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        deadline = t0 + duration

    if spread:
        deadline = time.perf_counter() + spread + duration
        asyncio.get_running_loop().call_later(spread, start)
    else:
        start()
    workers = conns[:concurrency]
    await asyncio.gather(*(worker(c, spread * k / len(workers)) for k, c in enumerate(workers)))
    t1 = time.perf_counter()
    return LoadResult(records, t1 - t0, t0, t1, time.process_time() - cpu0)


def close_all(conns: list[_Conn]) -> None:
    for c in conns:
        if c.transport is not None:
            c.transport.close()


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); nan when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(res: LoadResult) -> dict:
    ok = res.ok
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    itls = [x for r in ok for x in r.itl]
    tokens = sum(r.tokens or r.events for r in ok)
    return {
        "requests": len(res.records), "errors": len(res.errors), "first_error": res.errors[0] if res.errors else None,
        "tokens": tokens, "events": sum(r.events for r in ok), "sse_events": sum(r.sse_events for r in ok),
        "prompt_tokens": sum(r.prompt_tokens for r in ok), "cached_tokens": sum(r.cached_tokens for r in ok),
        "wall_s": res.wall, "tok_per_s": tokens / res.wall if res.wall else 0.0,
        "ttft_mean_ms": sum(ttfts) / len(ttfts) * 1e3 if ttfts else float("nan"),
        "ttft_p50_ms": percentile(ttfts, 50) * 1e3, "ttft_p99_ms": percentile(ttfts, 99) * 1e3,
        "itl_p50_ms": percentile(itls, 50) * 1e3, "itl_p99_ms": percentile(itls, 99) * 1e3,
        "client_cpu_s": res.client_cpu,
    }


def _model_id(url: str) -> str:
    import json
    import urllib.request

    with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=10) as r:
        return json.load(r)["data"][0]["id"]


def main() -> None:
    ap = argparse.ArgumentParser(description="Closed-loop streaming load against an OpenAI-compatible server.")
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="default: the first of /v1/models")
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("-c", "--concurrency", type=int, default=64)
    ap.add_argument("-n", "--requests", type=int, default=0, help="total requests (default 2 per stream)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args()

    async def go() -> None:
        model = args.model or await asyncio.to_thread(_model_id, args.url)
        parts = urlsplit(args.url)
        raw = build_request(parts.hostname or "127.0.0.1", parts.port or 80, endpoint_path(args.endpoint),
                            request_body(args.endpoint, model, args.max_tokens), args.api_key)
        res = await run_load(args.url, raw, args.concurrency, args.requests or 2 * args.concurrency)
        for k, v in summarize(res).items():
            print(f"{k:>14}: {v:.2f}" if isinstance(v, float) else f"{k:>14}: {v}")

    import uvloop
    uvloop.run(go())


if __name__ == "__main__":
    main()
