"""Check what a client saw on the wire: JSON Schemas and the streaming contract.

`problems(exchanges, client)` looks at every recorded exchange (see
capture.py; the Node scripts record the same shape) and returns readable
problems, each naming the client, the endpoint and the exact field, e.g.

    openai-python POST /v1/chat/completions chunk 3: choices/0/delta/role:
    role in a chunk after the first of choice 0

Every chat response and every chat stream chunk is validated against
OpenAI's shapes (tests/support/openai_schema.py: the `openai` SDK's models,
as strict as OpenAI's API reference); `/v1/models` against
ListModelsResponse / Model; errors against ErrorResponse.
`/v1/completions` gets a structural check here. On top of the schemas, streams are held to the
contract the clients rely on (the known traps): role only in the first
chunk of a choice, `content` a string (never null) in text deltas,
`finish_reason` on the last chunk of a choice only, the usage chunk last
with `choices: []`, `system_fingerprint` on every chunk, tool-call
fragments with an integer `index` whose first fragment carries id, type,
name and `arguments: ""`, and the stream ending in exactly `data: [DONE]`.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support import sse
from tests.support.openai_schema import errors as schema_errors

DONE = "[DONE]"


def sse_data(body: bytes) -> tuple[list[str], list[str]]:
    """The `data` payloads of an SSE body (comments skipped) and framing problems."""
    frames, issues = sse.parse(body)
    out: list[str] = []
    for frame in frames:
        if frame.event is not None:  # chat and completions streams carry no event names
            issues.append(f"unexpected SSE field 'event' in event {frame.raw[:80]!r}")
        if frame.data is not None:
            out.append(frame.data.decode("utf-8"))
    return out, issues


def stream_chunks(body: bytes) -> list[dict[str, Any]]:
    """The JSON chunks of a stream body (no [DONE]); raises on junk."""
    data, _ = sse_data(body)
    return [json.loads(d) for d in data if d != DONE]


def _request_json(ex: Any) -> dict[str, Any]:
    try:
        value = json.loads(ex.request_body or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def chat_stream_problems(chunks: list[dict[str, Any]], request: dict[str, Any]) -> list[str]:
    """The streaming contract beyond the schema; each problem starts with `chunk N: field:`."""
    out: list[str] = []
    seen_choice: dict[int, int] = {}  # choice index -> chunks seen
    finished: dict[int, int] = {}  # choice index -> chunk number of its finish
    calls: dict[tuple[int, int], dict[str, Any]] = {}
    usage_at: list[int] = []
    ids = {c.get("id") for c in chunks}
    if len(ids) > 1:
        out.append(f"id: differs between chunks: {sorted(map(str, ids))}")
    if len({c.get("created") for c in chunks}) > 1:
        out.append("created: differs between chunks")
    for n, chunk in enumerate(chunks):
        where = f"chunk {n}"
        if "system_fingerprint" not in chunk:
            out.append(f"{where}: system_fingerprint: missing")
        if chunk.get("object") != "chat.completion.chunk":
            out.append(f"{where}: object: {chunk.get('object')!r}, expected 'chat.completion.chunk'")
        choices = chunk.get("choices")
        if chunk.get("usage") is not None and choices == []:
            usage_at.append(n)
            continue
        if not choices:
            out.append(f"{where}: choices: {choices!r} without usage (only the usage chunk has no choices)")
            continue
        for c in choices:
            i = c.get("index")
            delta = c.get("delta") or {}
            field = f"{where}: choices/{i}"
            first = i not in seen_choice
            seen_choice[i] = seen_choice.get(i, 0) + 1
            if i in finished:
                out.append(f"{field}: chunk after the finish_reason chunk of this choice (chunk {finished[i]})")
            if first and delta.get("role") != "assistant":
                out.append(f"{field}/delta/role: {delta.get('role')!r} in the first chunk, expected 'assistant'")
            if not first and "role" in delta:
                out.append(f"{field}/delta/role: role in a chunk after the first of choice {i}")
            if "content" in delta and delta["content"] is None and not delta.get("tool_calls") and not (first and _expects_tools(request)):
                out.append(f"{field}/delta/content: null in a text delta (clients expect a string, '' when empty)")
            if first and "tool_calls" not in delta and delta.get("content") is None and not _expects_tools(request):
                out.append(f"{field}/delta/content: first chunk of a text stream has content {delta.get('content')!r}, expected ''")
            if c.get("finish_reason") is not None:
                finished[i] = n
            for tc in delta.get("tool_calls") or []:
                out.extend(_tool_fragment_problems(f"{field}/delta/tool_calls", tc, i, calls))
    if usage_at:
        if usage_at != [len(chunks) - 1]:
            out.append(f"usage: the usage chunk (choices: []) must be the single last chunk, found at {usage_at} of {len(chunks)}")
    elif (request.get("stream_options") or {}).get("include_usage"):
        out.append("usage: stream_options.include_usage was sent but no chunk has usage with choices: []")
    for i in seen_choice:
        if i not in finished:
            out.append(f"choices/{i}/finish_reason: no chunk of choice {i} has a finish_reason")
    for (i, k), call in calls.items():
        try:
            json.loads(call["arguments"])
        except ValueError:
            out.append(f"choices/{i}/delta/tool_calls/{k}/function/arguments: the fragments concatenate to non-JSON {call['arguments']!r}")
    return out


def _expects_tools(request: dict[str, Any]) -> bool:
    return bool(request.get("tools")) and request.get("tool_choice") != "none"


def _tool_fragment_problems(field: str, tc: dict[str, Any], choice: int, calls: dict) -> list[str]:
    out: list[str] = []
    k = tc.get("index")
    if not isinstance(k, int) or isinstance(k, bool):
        return [f"{field}/index: {k!r}, expected an integer"]
    fn = tc.get("function") or {}
    key = (choice, k)
    args = fn.get("arguments")
    if args is not None and not isinstance(args, str):
        out.append(f"{field}/{k}/function/arguments: {type(args).__name__}, expected a JSON string")
        args = json.dumps(args)
    if key not in calls:
        if not tc.get("id"):
            out.append(f"{field}/{k}/id: missing in the first fragment")
        if tc.get("type") != "function":
            out.append(f"{field}/{k}/type: {tc.get('type')!r} in the first fragment, expected 'function'")
        if not fn.get("name"):
            out.append(f"{field}/{k}/function/name: missing in the first fragment")
        if args != "":
            out.append(f"{field}/{k}/function/arguments: {args!r} in the first fragment, expected ''")
        calls[key] = {"arguments": args or ""}
    else:
        if tc.get("id") or fn.get("name"):
            out.append(f"{field}/{k}: id/name repeated in a later fragment")
        calls[key]["arguments"] += args or ""
    return out


def chat_message_problems(body: dict[str, Any], request: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if "system_fingerprint" not in body:
        out.append("system_fingerprint: missing")
    for c in body.get("choices") or []:
        i = c.get("index")
        msg = c.get("message") or {}
        if msg.get("tool_calls"):
            for k, tc in enumerate(msg["tool_calls"]):
                args = (tc.get("function") or {}).get("arguments")
                if not isinstance(args, str):
                    out.append(f"choices/{i}/message/tool_calls/{k}/function/arguments: {type(args).__name__}, expected a JSON string")
        elif not isinstance(msg.get("content"), str):
            out.append(f"choices/{i}/message/content: {msg.get('content')!r} without tool_calls, expected a string")
    return out


def completion_problems(body: dict[str, Any], chunk: bool) -> list[str]:
    out = []
    if body.get("object") != "text_completion":
        out.append(f"object: {body.get('object')!r}, expected 'text_completion'")
    for key in ("id", "created", "model", "choices"):
        if key not in body:
            out.append(f"{key}: missing")
    for c in body.get("choices") or []:
        if not isinstance(c.get("text"), str):
            out.append(f"choices/{c.get('index')}/text: {c.get('text')!r}, expected a string")
        if "finish_reason" not in c:
            out.append(f"choices/{c.get('index')}/finish_reason: missing")
    if not chunk and "usage" not in body:
        out.append("usage: missing")
    return out


def exchange_problems(ex: Any, stream_error: bool = False) -> list[str]:
    """Problems of one exchange, without the client prefix.

    `stream_error`: an in-band error event is expected (the engine failed
    mid-stream): it must fit ErrorResponse and be followed by [DONE] only.
    """
    path = ex.path
    request = _request_json(ex)
    if ex.status >= 400:
        try:
            return [f"error body: {m}" for m in schema_errors("ErrorResponse", json.loads(ex.body))]
        except ValueError:
            return [f"error body is not JSON: {ex.body[:200]!r}"]
    if ex.content_type == "text/event-stream":
        data, out = sse_data(ex.body)
        if ex.complete and (not data or data[-1] != DONE):
            out.append(f"stream does not end with data: [DONE] (last event {data[-1:]!r})")
        if DONE in data[:-1]:
            out.append("data: [DONE] before the end of the stream")
        chunks = []
        for n, d in enumerate(d for d in data if d != DONE):
            try:
                chunk = json.loads(d)
            except ValueError:
                out.append(f"chunk {n}: not JSON: {d[:200]!r}")
                continue
            chunks.append(chunk)
            if "error" in chunk:
                if not stream_error:
                    out.append(f"chunk {n}: in-band error: {chunk['error']}")
                out.extend(f"chunk {n}: error event: {m}" for m in schema_errors("ErrorResponse", chunk))
                if data[n + 1:] != [DONE]:
                    out.append(f"chunk {n}: the error event is not followed by data: [DONE] alone")
                continue
            if path.endswith("/chat/completions"):
                out.extend(f"chunk {n}: {m}" for m in schema_errors("CreateChatCompletionStreamResponse", chunk))
            elif path.endswith("/completions"):
                out.extend(f"chunk {n}: {m}" for m in completion_problems(chunk, chunk=True))
        if stream_error and not any("error" in c for c in chunks):
            out.append("no in-band error event in a stream that should have failed")
        if path.endswith("/chat/completions") and not stream_error:
            out.extend(chat_stream_problems(chunks, request))
        return out
    try:
        body = json.loads(ex.body)
    except ValueError:
        return [f"body is not JSON: {ex.body[:200]!r}"]
    if path.endswith("/chat/completions"):
        return schema_errors("CreateChatCompletionResponse", body) + chat_message_problems(body, request)
    if path.endswith("/completions"):
        return completion_problems(body, chunk=False)
    if path.endswith("/models"):
        return schema_errors("ListModelsResponse", body)
    if "/models/" in path:
        return schema_errors("Model", body)
    return []


def problems(exchanges: list[Any], client: str, stream_error: bool = False) -> list[str]:
    out: list[str] = []
    for ex in exchanges:
        out.extend(f"{client} {ex.method} {ex.path}: {m}" for m in exchange_problems(ex, stream_error))
    return out


def assert_wire_ok(exchanges: list[Any], client: str, *, min_exchanges: int = 1, stream_error: bool = False) -> None:
    """Every exchange the client made fits the schemas and the streaming contract."""
    assert len(exchanges) >= min_exchanges, f"{client}: expected at least {min_exchanges} recorded exchange(s), got {exchanges}"
    found = problems(exchanges, client, stream_error)
    assert not found, "\n".join(found)
