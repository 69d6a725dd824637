"""A mixed soak: every kind of client at once against one server, each answer checked.

`concurrency` workers each loop: pick a kind of request by weight, send it,
check its answer, record the outcome. The kinds (`KINDS`):

    stream         chat stream, ends with a finish_reason and `data: [DONE]`
    nonstream      chat, one JSON body with a finish_reason
    completions    legacy completions stream, same end
    tools          chat with a tool (stream or not): tool_calls come back
    engine_error   a prompt the fake engine fails after 3 tokens (--fake-fail-on):
                   an in-band error event and [DONE], or a 500 OpenAI error
    disconnect     a stream the client drops after its first event
    slow_reader    a raw socket with a 4 KiB receive buffer reading 512 bytes per
                   0.1 s, slower than the server writes: the stream must still
                   end with a finish_reason and [DONE]
    bad_input      one of `BAD_INPUTS` (broken JSON, wrong types, out-of-range
                   values, an unknown model, ...): a 4xx OpenAI error; a 5xx is
                   counted apart ("5xx for bad input")

An answer that is not what its kind expects (a wrong status, a stream
without its end, a connection error, no answer within `REQUEST_BOUND` s) is
a *lost* request; engine errors, disconnects, slow readers and bad inputs
that end as expected are *faults survived*. The server must run with
`server_args()` (the fake engine's text is a hermes tool call; `FAIL` in a
prompt fails the request).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

REQUEST_BOUND = 60.0
FAIL = "FAIL"
END = "<|end|>"
TOOL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' + END
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

# kind -> weight
KINDS = {"stream": 25, "nonstream": 12, "completions": 6, "tools": 10, "engine_error": 12, "disconnect": 12,
         "slow_reader": 4, "bad_input": 19}
FAULTS = ("engine_error", "disconnect", "slow_reader", "bad_input")

_USER = [{"role": "user", "content": "What is the weather in Paris?"}]
# (path, raw body) pairs every correct server answers with a 4xx.
BAD_INPUTS: list[tuple[str, bytes]] = [
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"'),
    ("/v1/chat/completions", b'{"messages": "hi"}'),
    ("/v1/chat/completions", b"{}"),
    ("/v1/chat/completions", b"[1, 2, 3]"),
    ("/v1/chat/completions", b"\xff\xfe not json"),
    ("/v1/chat/completions", json.dumps({"messages": _USER, "max_tokens": -5}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": _USER, "max_tokens": 10**9}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": _USER, "n": 1000}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": _USER, "temperature": "hot"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": _USER, "model": "no-such-model"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": _USER, "tools": [{"type": "function"}]}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": _USER, "stream": "yes"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": _USER, "logprobs": True, "top_logprobs": 99}).encode()),
    ("/v1/completions", json.dumps({"prompt": {"nested": True}}).encode()),
    ("/v1/completions", json.dumps({"prompt": "hi", "stop": 7}).encode()),
]


def server_args() -> list[str]:
    return ["--fake-token-delay", "0.02", "--fake-text", TOOL_TEXT, "--fake-fail-after", "3", "--fake-fail-on", FAIL,
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--access-log", "off"]


@dataclass
class Tally:
    sent: Counter = field(default_factory=Counter)  # kind -> requests
    ok: Counter = field(default_factory=Counter)  # kind -> answered as expected
    lost: Counter = field(default_factory=Counter)  # kind -> not
    bad_input_5xx: int = 0
    bad_input_accepted: int = 0  # a 2xx for a bad input (not lost, but worth a look)
    examples: list[str] = field(default_factory=list)  # the first few lost ones, why

    def lose(self, kind: str, why: str) -> None:
        self.lost[kind] += 1
        if len(self.examples) < 20:
            self.examples.append(f"{kind}: {why}"[:300])


def _stream_ended(raw: bytes) -> str | None:
    """None when an SSE body ends with a finish_reason (or a usage chunk) and [DONE]; else why not."""
    frames = [f for f in raw.split(b"\n\n") if f.startswith(b"data: ")]
    if len(frames) < 2 or frames[-1] != b"data: [DONE]":
        return f"no [DONE] at the end: {raw[-200:]!r}"
    last = json.loads(frames[-2][6:])
    if "error" in last:
        return f"error event: {last['error']}"
    if not last.get("choices") or last["choices"][0].get("finish_reason") is None:
        return f"no finish_reason: {frames[-2][:200]!r}"
    return None


def _ended_with_error(raw: bytes) -> str | None:
    frames = [f for f in raw.split(b"\n\n") if f.startswith(b"data: ")]
    if len(frames) < 2 or frames[-1] != b"data: [DONE]" or b'"error"' not in frames[-2]:
        return f"no error event then [DONE]: {raw[-200:]!r}"
    return None


def _openai_error(raw: bytes) -> str | None:
    try:
        data = json.loads(raw)
        assert list(data) == ["error"] and {"message", "type", "code"} <= set(data["error"])
    except Exception:
        return f"not an OpenAI error body: {raw[:200]!r}"
    return None


class Soak:
    def __init__(self, base: str, port: int, model: str = "fake") -> None:
        self.base = base
        self.port = port
        self.model = model
        self.tally = Tally()
        self._bad = 0

    async def run(self, concurrency: int, seconds: float, seed: int = 1) -> Tally:
        """`concurrency` workers for `seconds`; every request is finished or bounded before it returns."""
        rng = random.Random(seed)
        kinds, weights = list(KINDS), list(KINDS.values())
        deadline = time.monotonic() + seconds
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_BOUND)) as session:

            async def worker() -> None:
                while time.monotonic() < deadline:
                    kind = rng.choices(kinds, weights)[0]
                    self.tally.sent[kind] += 1
                    try:
                        async with asyncio.timeout(REQUEST_BOUND):
                            why = await getattr(self, "_" + kind)(session, rng)
                    except TimeoutError:
                        why = f"no answer within {REQUEST_BOUND:g} s"
                    except (aiohttp.ClientError, OSError, ValueError) as exc:
                        why = f"{type(exc).__name__}: {exc}"
                    if why is None:
                        self.tally.ok[kind] += 1
                    else:
                        self.tally.lose(kind, why)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        return self.tally

    def _chat(self, content: str = "What is the weather in Paris?", **extra: object) -> dict:
        return {"model": self.model, "messages": [{"role": "user", "content": content}], "stop": [END], **extra}

    async def _post(self, session: aiohttp.ClientSession, path: str, body: dict) -> tuple[int, bytes]:
        async with session.post(self.base + path, json=body) as resp:
            return resp.status, await resp.read()

    async def _stream(self, session: aiohttp.ClientSession, rng: random.Random) -> str | None:
        status, raw = await self._post(session, "/v1/chat/completions", self._chat(stream=True, max_tokens=64))
        return f"HTTP {status}" if status != 200 else _stream_ended(raw)

    async def _nonstream(self, session: aiohttp.ClientSession, rng: random.Random) -> str | None:
        status, raw = await self._post(session, "/v1/chat/completions", self._chat(max_tokens=64))
        if status != 200:
            return f"HTTP {status}: {raw[:200]!r}"
        return None if json.loads(raw)["choices"][0]["finish_reason"] else f"no finish_reason: {raw[:200]!r}"

    async def _completions(self, session: aiohttp.ClientSession, rng: random.Random) -> str | None:
        body = {"model": self.model, "prompt": "Once upon a time", "stream": True, "max_tokens": 40, "stop": [END]}
        status, raw = await self._post(session, "/v1/completions", body)
        return f"HTTP {status}" if status != 200 else _stream_ended(raw)

    async def _tools(self, session: aiohttp.ClientSession, rng: random.Random) -> str | None:
        stream = rng.random() < 0.5
        status, raw = await self._post(session, "/v1/chat/completions", self._chat(tools=TOOLS, stream=stream, max_tokens=64))
        if status != 200:
            return f"HTTP {status}: {raw[:200]!r}"
        if stream:
            return _stream_ended(raw) or (None if b'"tool_calls"' in raw else "no tool_calls in the stream")
        choice = json.loads(raw)["choices"][0]
        return None if choice["message"].get("tool_calls") and choice["finish_reason"] == "tool_calls" else f"no tool call: {choice}"

    async def _engine_error(self, session: aiohttp.ClientSession, rng: random.Random) -> str | None:
        stream = rng.random() < 0.5
        status, raw = await self._post(session, "/v1/chat/completions", self._chat(f"{FAIL} please", stream=stream, max_tokens=64))
        if stream:
            return f"HTTP {status}" if status != 200 else _ended_with_error(raw)
        return f"HTTP {status}: {raw[:200]!r}" if status != 500 else _openai_error(raw)

    async def _disconnect(self, session: aiohttp.ClientSession, rng: random.Random) -> str | None:
        body = self._chat(stream=True, max_tokens=2000, ignore_eos=True)
        del body["stop"]
        async with session.post(self.base + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                return f"HTTP {resp.status}"
            await resp.content.readuntil(b"\n\n")
            resp.close()  # gone, mid-stream: the connection is dropped
        return None

    async def _slow_reader(self, session: aiohttp.ClientSession, rng: random.Random) -> str | None:
        body = json.dumps({"model": self.model, "messages": _USER, "stream": True, "max_tokens": 150}).encode()
        request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            writer.write(request)
            data = b""
            while not data.endswith(b"0\r\n\r\n"):
                chunk = await reader.read(512)
                if not chunk:
                    return f"connection closed early: {data[-200:]!r}"
                data += chunk
                await asyncio.sleep(0.1)
        finally:
            writer.close()
        head, _, chunked = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            return head[:100].decode(errors="replace")
        return _stream_ended(_dechunk(chunked))

    async def _bad_input(self, session: aiohttp.ClientSession, rng: random.Random) -> str | None:
        path, raw = BAD_INPUTS[self._bad % len(BAD_INPUTS)]
        self._bad += 1
        async with session.post(self.base + path, data=raw, headers={"Content-Type": "application/json"}) as resp:
            status, got = resp.status, await resp.read()
        if status >= 500:
            self.tally.bad_input_5xx += 1
            return f"{status} for bad input {raw[:80]!r}: {got[:200]!r}"
        if status < 400:
            self.tally.bad_input_accepted += 1
            return None
        return _openai_error(got)


def _dechunk(data: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        eol = data.index(b"\r\n", pos)
        size = int(data[pos:eol].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2
