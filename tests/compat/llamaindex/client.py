"""LlamaIndex's `OpenAILike` against streamproxy, run by tests/compat/test_llamaindex.py.

Runs in LlamaIndex's own virtualenv (see requirements.txt beside this file),
reads its configuration as JSON on stdin:

    {"base": "http://127.0.0.1:PORT/v1", "model": "...", "max_tokens": 6,
     "stop": [...] | null, "cases": ["chat", ...] (default: all)}

calls `complete`, `chat`, `stream_chat`, `astream_chat` (chat model) and
`complete` / `stream_complete` on /v1/completions (`is_chat_model=False`), and
prints one JSON line: what each call returned, plus every exchange on the
wire (tests/compat/capture.py) for the schema checks.

Run it as a module from the repository root, as tests/compat/conftest.py does:
`.venv/llamaindex/bin/python -m tests.compat.llamaindex.client < config.json`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback

import httpx
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

from tests.compat.capture import Wire


def main() -> None:
    config = json.loads(sys.stdin.read())
    wire = Wire(httpx)
    kw = dict(
        model=config["model"], api_base=config["base"], api_key="unused", temperature=0,
        max_tokens=config["max_tokens"], context_window=2048, max_retries=0, timeout=120,
        http_client=wire.client(), async_http_client=wire.async_client(),
        additional_kwargs={"stop": config["stop"]} if config.get("stop") else {},
    )
    chat_llm = OpenAILike(is_chat_model=True, **kw)
    text_llm = OpenAILike(is_chat_model=False, **kw)
    messages = [ChatMessage(role="user", content=config.get("prompt", "Say hello in five words."))]
    results: dict = {}

    def record(name, fn):
        try:
            results[name] = fn()
        except Exception as exc:  # reported, so one broken call does not hide the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}

    def complete():
        r = chat_llm.complete("Say hello in five words.")
        return {"text": r.text}

    def chat():
        r = chat_llm.chat(messages)
        return {"role": str(r.message.role.value), "content": r.message.content, "raw_keys": sorted((r.raw or {}).keys()) if isinstance(r.raw, dict) else None}

    def stream_chat():
        deltas, last = [], None
        for r in chat_llm.stream_chat(messages):
            deltas.append(r.delta)
            last = r
        return {"deltas": deltas, "content": last.message.content if last else None}

    def astream_chat():
        async def go():
            deltas, last = [], None
            async for r in await chat_llm.astream_chat(messages):
                deltas.append(r.delta)
                last = r
            return {"deltas": deltas, "content": last.message.content if last else None}
        return asyncio.run(go())

    def legacy_complete():
        r = text_llm.complete("The capital of France is")
        return {"text": r.text}

    def legacy_stream_complete():
        deltas, last = [], None
        for r in text_llm.stream_complete("The capital of France is"):
            deltas.append(r.delta)
            last = r
        return {"deltas": deltas, "text": last.text if last else None}

    cases = {
        "complete": complete, "chat": chat, "stream_chat": stream_chat, "astream_chat": astream_chat,
        "legacy_complete": legacy_complete, "legacy_stream_complete": legacy_stream_complete,
    }
    for name in config.get("cases") or list(cases):
        record(name, cases[name])
    print(json.dumps({"results": results, "wire": wire.dump()}))


if __name__ == "__main__":
    main()
