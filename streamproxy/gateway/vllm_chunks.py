"""A `vllm serve` replica's continuation in a migrating stream: its chunks as the client's (`continued`).

A stream that broke off on any replica goes on, on a vLLM replica, as a `/v1/completions` request
of token ids (resume.py's `continuation`). Its chunks are rewritten here into the client's stream:
the stream's own head (id, created, model), chat chunks made of completion chunks (no second role
chunk, the text as the delta's content), the ids kept (tracking) and shown only if the client asked,
and the usage chunk the whole generation's (`totals`: prompt tokens once, completion tokens all the
client got). A replica's in-band error about the request itself (`client_error`: a 4xx) goes to the
client as it came; any other is the break (`failed`). Sans-IO.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from streamproxy.gateway.serve_chunks import _EVENT, payload

if TYPE_CHECKING:
    from streamproxy.gateway.resume import Stream

_DONE = b"data: [DONE]\n\n"


def continued(stream: Stream, block: bytes) -> bytes:
    """A vLLM replica's continuation chunks as the client's stream's (see the module's comment)."""
    out: list[bytes] = []
    for event in _EVENT.findall(block):
        if not event.startswith(b"data:"):
            out.append(event)  # a keep-alive comment
            continue
        if event.startswith(_DONE.rstrip()):
            out.append(_DONE)
            continue
        data = payload(event)
        if "error" in data:
            error = data["error"] if isinstance(data["error"], dict) else {}
            if client_error(error):
                out.append(event)
                continue
            stream.failed = error
            break
        chunk = _rewrite(stream, data)
        if chunk is not None:
            out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    return b"".join(out)


def _rewrite(stream: Stream, data: dict[str, Any]) -> dict[str, Any] | None:
    """One completions chunk of the continuation as the client's chunk (None: nothing for the client)."""
    head = stream.head
    assert head is not None
    choices = data.get("choices")
    if not choices:
        usage = data.get("usage")
        if not isinstance(usage, dict):
            return None
        stream.replica_usage = stream.usage_sent = True
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            stream.cached = details["cached_tokens"]
        return {**data, **head, "usage": stream.whole_usage(usage)}
    choice = choices[0]
    ids = choice.get("token_ids") or []
    if stream.tracking:
        stream.generated.extend(ids)
    finish = choice.get("finish_reason")
    if finish is not None:
        stream.finished = True
    if not stream.chat:
        if "prompt_token_ids" in choice:
            choice["prompt_token_ids"] = None
        if "token_ids" in choice and not stream.client_ids:
            choice["token_ids"] = None
        return {**data, **head}
    delta: dict[str, Any] = {"content": choice.get("text") or ""}
    out: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        out["stop_reason"] = choice.get("stop_reason")
    out["token_ids"] = ids if stream.client_ids else None
    return {**head, "choices": [out]}


def client_error(error: dict[str, Any]) -> bool:
    """An in-band error about the request itself (4xx), passed on as it came."""
    code, kind = error.get("code"), error.get("type")
    if isinstance(code, int) and not isinstance(code, bool):
        return 400 <= code < 500
    return kind in ("invalid_request_error", "BadRequestError", "NotFoundError")
