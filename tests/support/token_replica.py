"""A fake vLLM replica that speaks `return_token_ids` and token-id prompts, and breaks on demand.

Its "model" is a function of the whole sequence (prompt ids and every generated id), so a
continuation sent the prompt's ids and the generated ones generates exactly what an
unbroken run would: `next_token(seq)`. Token `i` reads `TEXT[i]`; `EOS` ends a generation
(`finish_reason: "stop"`) once the sequence is `eos_len` long, `max_tokens` (by default the
rest of `MAX_MODEL_LEN`) with "length". The chunks are vLLM 0.32's bytes
(pydantic's `model_dump_json(exclude_unset=True)`: `token_ids` and `prompt_token_ids`
present as `null` when not asked for; chat's first chunk the role's), one token per chunk,
and the usage chunk when `stream_options.include_usage`; `id` and `created` fixed.

`TokenReplica.breaks` is a shared list of what the next streams do: `(mode, k)` writes the
stream's first `k` events and then "reset" (a TCP RST), "close" (the connection closed
mid-body), "stall" (nothing more, the connection left open) or "error" (vLLM's in-band error
and `[DONE]`). Every request is recorded in `seen` (path, decoded body). `hold_after` and `gate` hold chat
streams mid-way (so a test knows they run); `kill()` resets every connection and closes the port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

from aiohttp import web

VOCAB = 50
EOS = 0
TEXT = ["</s>"] + [f" w{i}" for i in range(1, VOCAB)]
CREATED = 1700000000
MAX_MODEL_LEN = 64


def next_token(seq: list[int]) -> int:
    """The model: greedy, a function of the whole sequence."""
    a, b = (seq[-2], seq[-1]) if len(seq) >= 2 else (0, seq[-1] if seq else 0)
    return (a * 7 + b * 3 + len(seq)) % VOCAB or 1  # never EOS on its own: `eos_len` ends it


def encode(text: str) -> list[int]:
    return [1 + (ord(c) % (VOCAB - 1)) for c in text]


def dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class TokenReplica:
    def __init__(self, name: str, breaks: list[tuple[str, int]], *, eos_len: int | None = None, per_chunk: int = 1,
                 sends_ids: bool = True) -> None:
        self.name = name
        self.sends_ids = sends_ids  # False: `return_token_ids` ignored (as a `streamproxy serve` replica)
        self.breaks = breaks  # shared by the replicas of a test: the next stream's break, if any
        self.eos_len = eos_len  # the sequence's length (prompt and generated) at which the model says EOS
        self.per_chunk = per_chunk  # tokens per chunk (a scheduler's step may emit several)
        # `hold(k, gate)`: chat streams wait after their k-th event until `gate` is set (`held` counts them).
        self.hold_after: int | None = None
        self.gate: asyncio.Event | None = None
        self.held = 0
        self._transports: set[Any] = set()
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.runner: web.AppRunner | None = None
        self.base = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        self.runner = web.AppRunner(app, shutdown_timeout=0.2)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.base = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()

    async def kill(self) -> None:
        """Gone at once, as a SIGKILLed replica: every connection reset, the port closed."""
        for transport in list(self._transports):
            transport.abort()
        await self.stop()

    # -- the routes -----------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((request.path, body))
        prompt = encode(json.dumps(body["messages"])) + [VOCAB - 1]
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        return await self._stream(request, body, self._chat_events(body, prompt, cap))

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((request.path, body))
        prompt = body["prompt"] if isinstance(body["prompt"], list) else encode(body["prompt"])
        return await self._stream(request, body, self._completion_events(body, prompt, body.get("max_tokens")))

    def _generate(self, prompt: list[int], cap: int | None) -> list[tuple[int, str | None]]:
        """Greedy up to `cap` (vLLM's default: the rest of MAX_MODEL_LEN), or EOS once the sequence is `eos_len` long."""
        seq, out = list(prompt), list[tuple[int, str | None]]()
        limit = cap if cap is not None else MAX_MODEL_LEN - len(prompt)
        while len(out) < limit:
            token = EOS if self.eos_len is not None and len(seq) >= self.eos_len else next_token(seq)
            seq.append(token)
            if token == EOS:
                out.append((token, "stop"))
                break
            out.append((token, "length" if len(out) + 1 == limit else None))
        return out

    def _steps(self, generated: list[tuple[int, str | None]]) -> list[tuple[list[int], str, str | None]]:
        """The generated tokens in chunks of `per_chunk`: ids, text, finish reason."""
        out = []
        for i in range(0, len(generated), self.per_chunk):
            step = generated[i : i + self.per_chunk]
            out.append(([t for t, _ in step], "".join("" if t == EOS else TEXT[t] for t, _ in step), step[-1][1]))
        return out

    def _chat_events(self, body: dict[str, Any], prompt: list[int], cap: int | None) -> list[bytes]:
        ids = body.get("return_token_ids") is True and self.sends_ids
        head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": CREATED, "model": body["model"]}
        first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
                 "prompt_token_ids": prompt if ids else None, "prompt_text": None}
        events = [first]
        generated = self._generate(prompt, cap)
        for tokens, text, finish in self._steps(generated):
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
            if finish is not None:
                choice["stop_reason"] = None
            choice["token_ids"] = tokens if ids else None
            events.append({**head, "choices": [choice]})
        return self._ending(body, head, events, len(prompt), len(generated))

    def _completion_events(self, body: dict[str, Any], prompt: list[int], cap: int | None) -> list[bytes]:
        ids = body.get("return_token_ids") is True and self.sends_ids
        head = {"id": "cmpl-fake", "object": "text_completion", "created": CREATED, "model": body["model"]}
        events = []
        generated = self._generate(prompt, cap)
        for n, (tokens, text, finish) in enumerate(self._steps(generated)):
            events.append({**head, "choices": [{
                "index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                "prompt_token_ids": prompt if ids and n == 0 else None, "token_ids": tokens if ids else None}]})
        return self._ending(body, head, events, len(prompt), len(generated))

    def _ending(self, body: dict[str, Any], head: dict[str, Any], events: list[dict[str, Any]], prompt: int, completion: int) -> list[bytes]:
        out = [b"data: " + dump(e) + b"\n\n" for e in events]
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
            out.append(b"data: " + dump({**head, "choices": [], "usage": usage}) + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        return out

    async def _stream(self, request: web.Request, body: dict[str, Any], events: list[bytes]) -> web.StreamResponse:
        mode, k = self.breaks.pop(0) if self.breaks else ("", len(events))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self._transports.add(request.transport)
        hold = self.hold_after if request.path == "/v1/chat/completions" else None
        for n, event in enumerate(events[:k]):
            await response.write(event)
            if n + 1 == hold and self.gate is not None:
                self.held += 1
                await self.gate.wait()
        if not mode:
            await response.write_eof()
            return response
        transport = request.transport
        assert transport is not None
        if mode == "error":
            error = {"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError", "param": None, "code": 500}}
            await response.write(b"data: " + dump(error) + b"\n\n" + b"data: [DONE]\n\n")
            await response.write_eof()
        elif mode == "stall":
            await asyncio.sleep(3600)  # until the gateway gives up on it (and the connection closes)
        elif mode == "reset":
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        else:  # close
            transport.close()
        return response
