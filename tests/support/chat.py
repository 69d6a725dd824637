"""Chat completion streams as a client sees them: schema-checked chunks, reassembled.

`chat_chunks(body)` is `sse.payloads(body)` with every chunk validated
against OpenAI's CreateChatCompletionStreamResponse. `reassemble(chunks,
index)` rebuilds one choice the way the OpenAI SDK's stream accumulator
does: the content (None until a non-empty piece arrives), the tool calls
(id, name, the concatenated arguments), the finish reason. It asserts the
tool-call fragment rules clients rely on as it goes: a call's first
fragment comes in index order with its id (once), `type: "function"`, the
name and `arguments: ""`; later fragments carry only `index` and
`function.arguments`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tests.support import sse
from tests.support.openai_schema import validate


class Call(NamedTuple):
    id: str
    name: str
    arguments: str


class Reassembled(NamedTuple):
    content: str | None
    calls: list[Call]
    finish_reason: str | None


def chat_chunks(body: bytes) -> list[dict[str, Any]]:
    payloads = sse.payloads(body)
    for p in payloads:
        validate("CreateChatCompletionStreamResponse", p)
    return payloads


def reassemble(chunks: list[dict[str, Any]], index: int = 0) -> Reassembled:
    content: str | None = None
    calls: dict[int, list[str]] = {}
    reason = None
    for chunk in chunks:
        for ch in chunk["choices"]:
            if ch["index"] != index:
                continue
            delta = ch["delta"]
            if delta.get("content"):
                content = (content or "") + delta["content"]
            for tc in delta.get("tool_calls", []):
                if "id" in tc:
                    assert tc["index"] not in calls, f"id sent twice: {tc}"
                    assert tc["index"] == len(calls), f"calls out of order: {tc}"
                    assert tc["type"] == "function" and tc["function"]["arguments"] == "", tc
                    calls[tc["index"]] = [tc["id"], tc["function"]["name"], ""]
                else:
                    assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}, tc
                    calls[tc["index"]][2] += tc["function"]["arguments"]
            reason = ch["finish_reason"] or reason
    return Reassembled(content, [Call(*calls[i]) for i in sorted(calls)], reason)
