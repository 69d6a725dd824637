"""Locust load test for any OpenAI-compatible server (streamproxy, vLLM, ...).

    make loadtest HOST=http://127.0.0.1:8000 USERS=32 RUN_TIME=1m
    .venv/bin/locust -f locustfile.py --headless -H http://127.0.0.1:8000 -u 32 -r 8 -t 1m
    .venv/bin/locust -f locustfile.py StreamingChatUser ...   # one user class only

Two users: `StreamingChatUser` (SSE) and `NonStreamingChatUser`. Besides
locust's own entry per HTTP request (for a stream: time to the response
headers), each reports its token timings as their own entries, so locust's
table and percentiles show them:

- `SSE ttft`: time from sending to the first event with content (ms)
- `SSE per-token`: (last content event - first) / (tokens - 1), one value per request (ms)
- `SSE itl` (only with LOCUST_ITL=1): every gap between content events (ms; many entries)
- `non-stream per-token`: whole response time / completion tokens (ms)

The entries' "size" column is the number of tokens. Settings (environment):
LOCUST_MODEL (default: the first of /v1/models), LOCUST_MAX_TOKENS (128),
LOCUST_PROMPT, LOCUST_IGNORE_EOS (1), LOCUST_API_KEY, LOCUST_ITL (0),
LOCUST_STREAM_WEIGHT (3) and LOCUST_NONSTREAM_WEIGHT (1).
"""

from __future__ import annotations

import json
import os
import time

from locust import HttpUser, between, events, task

MAX_TOKENS = int(os.environ.get("LOCUST_MAX_TOKENS", "128"))
PROMPT = os.environ.get("LOCUST_PROMPT", "Tell me a long story about a lighthouse keeper who finds a message in a bottle.")
IGNORE_EOS = os.environ.get("LOCUST_IGNORE_EOS", "1") not in ("0", "false", "no")
API_KEY = os.environ.get("LOCUST_API_KEY")
ITL_EVENTS = os.environ.get("LOCUST_ITL", "0") not in ("0", "false", "no")
_model: str | None = os.environ.get("LOCUST_MODEL")


def _headers() -> dict[str, str]:
    h = {"Content-Type": "application/json"}
    if API_KEY:
        h["Authorization"] = f"Bearer {API_KEY}"
    return h


def _report(name: str, ms: float, length: int = 0, exc: Exception | None = None) -> None:
    events.request.fire(request_type="TOKENS", name=name, response_time=ms, response_length=length,
                        exception=exc, context={})


class _ChatUser(HttpUser):
    abstract = True
    wait_time = between(0.0, 0.5)

    def on_start(self) -> None:
        global _model
        if _model is None:
            with self.client.get("/v1/models", headers=_headers(), name="GET /v1/models", catch_response=True) as r:
                if r.status_code != 200:
                    r.failure(f"HTTP {r.status_code}")
                    raise RuntimeError(f"/v1/models answered {r.status_code}: {r.text[:200]}")
                _model = r.json()["data"][0]["id"]

    def _body(self, stream: bool) -> dict:
        body = {"model": _model, "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": MAX_TOKENS, "stream": stream, "ignore_eos": IGNORE_EOS}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body


class StreamingChatUser(_ChatUser):
    weight = int(os.environ.get("LOCUST_STREAM_WEIGHT", "3"))

    @task
    def stream_chat(self) -> None:
        start = time.perf_counter()
        first = last = None
        content_events = tokens = 0
        gaps: list[float] = []
        buf = b""
        error: Exception | None = None
        with self.client.post("/v1/chat/completions", json=self._body(True), headers=_headers(), stream=True,
                              name="POST /v1/chat/completions (stream)", catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return
            try:
                # chunk_size=None: yield data as it arrives (no 512-byte buffering).
                for data in resp.iter_content(chunk_size=None):
                    now = time.perf_counter()
                    buf += data
                    while b"\n\n" in buf:
                        event, buf = buf.split(b"\n\n", 1)
                        if not event.startswith(b"data: ") or event == b"data: [DONE]":
                            continue
                        obj = json.loads(event[6:])
                        if obj.get("usage"):
                            tokens = obj["usage"].get("completion_tokens") or tokens
                        if "error" in obj and not obj.get("choices"):
                            raise RuntimeError(f"in-band error: {obj['error']}")
                        for choice in obj.get("choices") or []:
                            if (choice.get("delta") or {}).get("content"):
                                if first is None:
                                    first = now
                                else:
                                    gaps.append(now - last)
                                last = now
                                content_events += 1
                                break
            except Exception as exc:  # noqa: BLE001 - every failure is a locust failure
                error = exc
                resp.failure(repr(exc))
            else:
                resp.success()
        tokens = tokens or content_events
        if first is None:
            _report("SSE ttft", (time.perf_counter() - start) * 1e3, 0, error or RuntimeError("no content"))
            return
        _report("SSE ttft", (first - start) * 1e3, tokens, error)
        if tokens > 1:
            _report("SSE per-token", (last - first) / (tokens - 1) * 1e3, tokens, error)
        if ITL_EVENTS:
            for gap in gaps:
                _report("SSE itl", gap * 1e3, 1)


class NonStreamingChatUser(_ChatUser):
    weight = int(os.environ.get("LOCUST_NONSTREAM_WEIGHT", "1"))

    @task
    def chat(self) -> None:
        start = time.perf_counter()
        with self.client.post("/v1/chat/completions", json=self._body(False), headers=_headers(),
                              name="POST /v1/chat/completions", catch_response=True) as resp:
            elapsed = time.perf_counter() - start
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return
            try:
                # streamproxy may send leading newlines (keepalive) before the JSON: json.loads skips them.
                tokens = json.loads(resp.content)["usage"]["completion_tokens"]
            except Exception as exc:  # noqa: BLE001
                resp.failure(repr(exc))
                return
            resp.success()
        if tokens:
            _report("non-stream per-token", elapsed / tokens * 1e3, tokens)
