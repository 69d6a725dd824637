"""Stream migration's core: one running stream's record, its continuation request, its rewriting. Sans-IO.

A chat or completions stream is continued on another replica when the one serving it breaks
off after its first byte (docs/gateway.md, "Stream migration"). `refusal(path, body)` says at
request time why a request cannot be continued exactly (None: it can; the gateway then asks
the replica for token ids, vLLM's `return_token_ids`). A `Stream` sits after the relay's
`SSERelay.feed` and sees every block of whole events the client gets:

  - relaying (the first attempt, or a resend when the client has had no event yet): it keeps
    the prompt's ids (a stream's first chunk carries `prompt_token_ids`) and every chunk's
    `token_ids`, and gives the client the bytes it would have had without asking for them
    (the lists made `null`, as vLLM sends them unasked; chat's empty-delta chunks, which vLLM
    sends only for the ids, dropped). A replica's in-band server error is not passed on: it
    is the break (`failed`), and what follows it is dropped.
  - continuing: `continuation()` is a `/v1/completions` request whose `prompt` is the prompt's
    ids and the generated ones, `max_tokens` (and `min_tokens`) less what was generated, the
    same sampling parameters, `return_token_ids` and usage. Its chunks are rewritten into the
    client's stream (vllm_chunks.py): the stream's own id, created and model, chat chunks made of
    completion chunks (no second role chunk), ids stripped unless asked, and the usage chunk the
    whole generation's (prompt tokens once, completion tokens all the client got).

A `streamproxy serve` replica says so (its stream's `Streamproxy-Continuation` header: `serve`): its
chunks carry the ids where it puts them, removed (not made null) for a client that did not ask, its
id-only chunks dropped; a break goes on as the same request with `continue_token_ids` (the generated
ids) on a serve replica, whose chunks are the unbroken stream's but for their id and created (the
first chunk's head put back): parser-shaped streams too (`parser_refusal` is a vLLM replica's only).
Responses and Anthropic Messages streams (`blocks`) go on on serve replicas only, the same way (their
events held, stripped, renumbered: serve_chunks.py); on a vLLM replica they are not tracked (`replica`).

Ids are kept as 32-bit arrays, at most `limit` per stream (prompt and generated); a longer
stream stops being tracked, and so does one whose replica sends no ids (its first chunk has no
`prompt_token_ids`: a `streamproxy serve` replica). Once events went out and nothing is kept or
stripped, a block costs one byte search (the finish marker) until the finish, then two.
"""

from __future__ import annotations

import re
from array import array
from typing import Any

import orjson

from streamproxy.gateway.refusals import BLOCKS, CHAT, COMPLETIONS, CONTINUED, RESPONSES, parser_refusal, refusal
from streamproxy.gateway.serve_chunks import _EVENT, _HEAD, BLOCK_ERROR, MESSAGES_KIND, RESPONSES_KIND, ServeChunks, block_error, payload
from streamproxy.gateway.vllm_chunks import _DONE, client_error, continued

__all__ = ["CHAT", "COMPLETIONS", "CONTINUED", "RESPONSES_KIND", "Stream", "parser_refusal", "refusal"]

_IDS = re.compile(rb'"(prompt_)?token_ids":\[([0-9, ]*)\]')
_TOKEN_IDS = b'"token_ids":['
_TOKEN_IDS_LEN = len(_TOKEN_IDS)
_PROMPT_IDS = b'"prompt_token_ids":['
CONTINUES = "streamproxy-continuation"  # serve's header: it takes `continue_token_ids`
# Keys a tool-call or reasoning parser puts in a delta (its text is not plain content: not continued).
_PARSED = (b'"reasoning":', b'"reasoning_content":', b'"tool_calls":', b'"delta":{}')
_ERROR = b'data: {"error"'
_PING = b"event: ping\n"  # what a silent Messages stream sends (a queued one, before its message_start)
FINISH_MARKER = _FINISHED = b'"finish_reason":"'  # a chunk that ends its choice
RESEND, CONTINUE, FINISHED, REFUSED = "resend", "continue", "finished", "refused"
NO_IDS = "the replica sent no token ids (`return_token_ids`)"
VLLM_EVENTS = "a vLLM replica's Responses and Messages streams carry no token ids"
EXHAUSTED = "max_migrations reached"  # (a refusal the migrations metric counts apart: `exhausted`)

# Chat-only request fields: what the prompt's ids already are, or what a completions request has not.
_CHAT_ONLY = frozenset((
    "messages", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "response_format",
    "chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "add_special_tokens",
    "documents", "mm_processor_kwargs", "reasoning_effort", "include_reasoning", "logprobs", "top_logprobs",
    "max_completion_tokens", "metadata", "store", "modalities", "audio", "prediction", "web_search_options",
    "service_tier", "return_prompt_text",
))
# Fields the continuation sets itself.
_SET = frozenset(("prompt", "max_tokens", "min_tokens", "stream", "stream_options", "echo", "return_token_ids"))
class Stream(ServeChunks):
    """One running stream: what it asked, the ids so far, what the client has had (see the module's comment)."""

    __slots__ = (
        "chat", "request", "limit", "left", "client_ids", "strip", "usage_chunk", "tracking", "prompt", "generated",
        "sent", "finished", "usage_sent", "parsed", "failed", "continuing", "head", "cached", "replica_usage", "why",
        "passive", "vllm_why",
    )

    def __init__(self, path: str, request: dict[str, Any], *, limit: int, migrations: int, client_ids: bool,
                 usage_chunk: bool, why: str | None = None, vllm_why: str | None = None) -> None:
        self.chat = path == CHAT
        self.request = request  # the client's request as sent upstream (the served model's name)
        self.limit = limit  # ids kept at most (prompt and generated)
        self.left = migrations  # migrations this request may still make
        self.client_ids = client_ids  # the client asked for `return_token_ids` itself
        self.usage_chunk = usage_chunk  # the client asked for the usage chunk
        self.why = why  # why it cannot be continued (refusal's), or None
        self.tracking = why is None
        self.strip = why is None and not client_ids  # the gateway asked for the ids: the client does not get them
        self.prompt: array[int] | None = None
        self.generated: array[int] = array("i")
        self.sent = False  # a data event went to the client
        self.finished = False  # the finish chunk went to the client
        self.usage_sent = False  # and the usage chunk
        self.parsed = False  # the replica's parser shaped the deltas (tool calls, reasoning)
        self.failed: dict[str, Any] | None = None  # the replica's in-band server error (the break)
        self.continuing = False  # the blocks are a continuation's
        self.head: dict[str, Any] | None = None  # the client's stream: id, object, created, model (its first chunk's)
        self.cached = 0
        self.replica_usage = False  # the last attempt's replica reported usage
        self.passive = False  # events went out and nothing is kept or stripped: only the finish is watched
        self.vllm_why = vllm_why  # why a vLLM replica's stream of it cannot go on (`parser_refusal`)
        super().__init__(None if path not in BLOCKS else RESPONSES_KIND if path == RESPONSES else MESSAGES_KIND)

    def replica(self, serve: bool) -> None:
        """The attempt's replica is (not) a `streamproxy serve` (its `CONTINUES` header): a block API's
        stream is not tracked on a vLLM replica (its events carry no ids; its chat streams still do)."""
        self.serve = serve
        if self.blocks is None:
            return
        if not serve and self.tracking:
            self._untracked(VLLM_EVENTS)
            self.strip = False
        elif serve and self.why is VLLM_EVENTS:  # a resend, on a serve replica after a vLLM one
            self.why, self.tracking, self.strip = None, True, not self.client_ids

    # -- the blocks the client gets ---------------------------------------------------------
    def feed(self, block: bytes) -> bytes:
        if self.failed is not None or not block:
            return b""
        if self.passive:
            return self._watched(block)
        if self.continuing:
            if not self.serve:
                return continued(self, block)
            block = self._reheaded(block)
        if _ERROR in block:
            return self._until_error(block)
        if self.blocks is not None and (self.error_held or BLOCK_ERROR in block):
            return self._block_until_error(block)
        return self._relayed(block)

    def _block_until_error(self, block: bytes) -> bytes:
        """A block API's `_until_error`: the replica's own failure (`block_error`) is the break unless the
        stream cannot go on; a Responses error waits for its response.failed, which says whose it is."""
        if self.error_held:
            block, self.error_held = self.error_held + block, b""
        events = _EVENT.findall(block)
        at = next(i for i, e in enumerate(events) if e.startswith(BLOCK_ERROR))
        before = self._relayed(b"".join(events[:at]))
        if not (self.serve and self.tracking):
            return before + b"".join(events[at:])
        assert self.blocks is not None
        server, error = block_error(self.blocks, events, at)
        if server is None:
            self.error_held = b"".join(events[at:])
            return before
        if server and self.plan()[0] != REFUSED:
            self.failed = error
            return before
        return before + self._released() + b"".join(events[at:])

    def _relayed(self, block: bytes) -> bytes:
        if b"data:" not in block:
            return block
        if self.blocks is not None:
            return self._block_relayed(block)
        if self.head is None and not self.continuing:
            self._head(block)
            if self.tracking and _PROMPT_IDS not in block:  # a replica that does not send ids (serve's)
                self._untracked(NO_IDS)
                self.strip = False
        self.sent = True
        self.passive = not (self.tracking or self.strip)
        if not self.finished and _FINISHED in block:
            self.finished = True
        if self.finished and b'"usage":{' in block:
            self.usage_sent = True
        if self.serve:
            return self._serve_ids(block) if (self.tracking or self.strip) and b"token_ids" in block else block
        for marker in _PARSED:
            if marker in block:
                self.parsed = True
                if marker == b'"delta":{}' and self.strip:
                    block = b"".join(e for e in _EVENT.findall(block) if not _empty_delta(e))
                break
        if (self.tracking or self.strip) and b"token_ids" in block:
            if self.prompt is None and self.tracking or _PROMPT_IDS in block:
                return _IDS.sub(self._ids, block)  # the first chunk's prompt ids (once per stream)
            return self._generated_ids(block)
        return block

    def _block_relayed(self, block: bytes) -> bytes:
        """A Responses or Messages stream's block: its head from the first (serve's), the ids kept and stripped,
        the client's next sequence number noted, its last event seen (then `finished`). No event is decoded."""
        if self.head is None and not self.continuing:
            self.head = {}
            if self.serve:
                self.head_bytes = self._block_head(block)
        if (self.tracking or self.strip) and b"token_ids" in block:
            block = self._serve_ids(block)
        if not self.sent and block.count(b"data:") > block.count(_PING):  # (a Messages ping is not the answer's)
            self.sent = True
        self.passive = not (self.tracking or self.strip)
        if self.tracking:
            if self.blocks == RESPONSES_KIND:
                self._sequenced(block)
            if self._block_ended(block):
                self.finished = True
        return block

    def _generated_ids(self, block: bytes) -> bytes:
        """Each chunk's `"token_ids":[...]` kept (tracking) and made null (strip): found, not matched (per read)."""
        out: list[bytes] = []
        find, start = block.find, 0
        at = find(_TOKEN_IDS)
        while at >= 0:
            end = find(b"]", at)
            if end < 0:
                break
            if self.tracking:
                ids = block[at + _TOKEN_IDS_LEN : end]
                if b"," in ids:
                    self.generated.extend(orjson.loads(b"[" + ids + b"]"))
                elif ids:
                    self.generated.append(int(ids))
            if self.strip:
                out.append(block[start:at])
                out.append(b'"token_ids":null')
                start = end + 1
            at = find(_TOKEN_IDS, end)
        if self.tracking and len(self.generated) + len(self.prompt or ()) > self.limit:
            self._untracked()
        if not out:
            return block
        out.append(block[start:])
        return b"".join(out)

    def _watched(self, block: bytes) -> bytes:
        """A passive stream's block, as it came: the finish chunk and the usage after it noted; an in-band
        error after the finish is the break (the client gets the usage chunk and [DONE] from `ending`).
        (A passive, unfinished stream's block without FINISH_MARKER comes back as it is: callers may skip `feed`.)"""
        if not self.finished:
            if _FINISHED not in block:
                return block
            self.finished = True
        if _ERROR in block:
            return self._until_error(block)
        if not self.usage_sent and b'"usage":{' in block:
            self.usage_sent = True
        return block

    def _prompt_ids(self, ids: list[int]) -> None:
        if self.prompt is None:
            self.prompt = array("i", ids)

    def _untracked(self, why: str = "longer than max_tracked_tokens") -> None:
        self.tracking, self.why = False, why
        self.prompt, self.generated = None, array("i")

    def _ids(self, match: re.Match[bytes]) -> bytes:
        if self.tracking:
            ids = orjson.loads(b"[" + match[2] + b"]")
            if match[1]:
                if self.prompt is None:
                    self.prompt = array("i", ids)
            else:
                self.generated.extend(ids)
            if len(self.generated) + len(self.prompt or ()) > self.limit:
                self._untracked()
        if not self.strip:
            return match[0]
        return b'"prompt_token_ids":null' if match[1] else b'"token_ids":null'

    def _until_error(self, block: bytes) -> bytes:
        """The events before the replica's error; the error is the break (what follows it is dropped) unless
        it is the client's own (4xx) or the stream cannot go on: then it goes on as the replica sent it."""
        events = _EVENT.findall(block)
        at = next(i for i, e in enumerate(events) if e.startswith(_ERROR))
        before = self._relayed(b"".join(events[:at]))
        error = payload(events[at]).get("error")
        error = error if isinstance(error, dict) else {}
        if not client_error(error) and self.plan()[0] != REFUSED:
            self.failed = error
            return before
        return before + b"".join(events[at:])

    def _head(self, block: bytes) -> None:
        for event in _EVENT.findall(block):
            if event.startswith(b"data: {"):
                data = payload(event)
                if "choices" in data:
                    self.head = {k: data[k] for k in ("id", "object", "created", "model") if k in data}
                    found = _HEAD.match(event)
                    self.head_bytes = found[0] if found else b""
                    return

    # -- whether and how it goes on -----------------------------------------------------------
    def plan(self) -> tuple[str, str | None]:
        """What to do now that the replica broke off: RESEND the request (the client has had no event:
        whatever it asked, it can be sent again), CONTINUE it, end it (FINISHED: its finish chunk went
        out), or not (REFUSED, and why)."""
        if self.finished:
            return FINISHED, None
        if self.left < 1:
            return REFUSED, EXHAUSTED
        if not self.sent:
            return RESEND, None
        why = self.refusal()
        return (REFUSED, why) if why is not None else (CONTINUE, None)

    def refusal(self) -> str | None:
        """Why the stream cannot be continued now (it broke off after events went out); None: it can."""
        if self.why is not None:
            return self.why
        if self.prompt is None or self.head is None:
            return NO_IDS
        if self.serve:
            return None if self.head_bytes else "the replica's chunks are not of the shape continued"
        if self.vllm_why is not None:
            return self.vllm_why
        if self.parsed:
            return "the replica's parser shaped the deltas (tool calls or reasoning)"
        cap = self._cap()
        if cap is not None and cap - len(self.generated) < 1:
            return "nothing is left to generate but the replica sent no finish"
        return None

    def _cap(self) -> int | None:
        cap = self.request.get("max_completion_tokens") if self.chat else None
        cap = cap if cap is not None else self.request.get("max_tokens")
        return cap if isinstance(cap, int) and not isinstance(cap, bool) else None

    def continuation(self) -> bytes:
        """The body of the `/v1/completions` request that continues the stream (after `refusal()` said None);
        a serve replica's: the request itself, with `continue_token_ids`."""
        assert self.prompt is not None
        if self.serve:
            return orjson.dumps({**self.request, "continue_token_ids": list(self.generated)})
        drop = _SET | _CHAT_ONLY if self.chat else _SET
        body = {k: v for k, v in self.request.items() if k not in drop}
        body["prompt"] = [*self.prompt, *self.generated]
        done = len(self.generated)
        cap = self._cap()
        if cap is not None:
            body["max_tokens"] = cap - done
        least = self.request.get("min_tokens")
        if isinstance(least, int) and least - done > 0:
            body["min_tokens"] = least - done
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        body["return_token_ids"] = True
        return orjson.dumps(body)

    def migrating(self, action: str) -> None:
        """The next blocks are a new attempt's: the continuation's (CONTINUE), or the request's own from
        its start (RESEND: nothing went to the client; the broken attempt's ids are forgotten)."""
        self.left -= 1
        self.failed = None
        self.replica_usage = self.passive = False
        self.rehead = self.seq_base = None
        self.held, self.error_held = [], b""
        if action == CONTINUE:
            self.continuing = True
        else:
            self.prompt, self.generated, self.head, self.parsed = None, array("i"), None, False
            self.head_bytes, self.serve, self.next_seq = b"", False, 0
            self.tracking = self.why is None

    def ending(self) -> bytes:
        """The end of a stream whose finish chunk went out before the replica broke off: the usage chunk if
        asked, and [DONE]."""
        if self.blocks is not None:
            return b""  # (its last event went out: nothing follows it)
        if not self.usage_chunk or self.usage_sent or self.head is None:
            return _DONE
        usage = {"prompt_tokens": len(self.prompt or ()), "total_tokens": 0, "completion_tokens": len(self.generated)}
        chunk = {**self.head, "choices": [], "usage": self.whole_usage(usage)}
        return b"data: " + orjson.dumps(chunk) + b"\n\n" + _DONE

    def totals(self) -> tuple[int, int, int]:
        """The whole generation's prompt, completion and cached tokens, as the client was told."""
        prompt = len(self.prompt or ())
        return prompt, len(self.generated), min(self.cached, prompt)

    def whole_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """A replica's usage made the whole generation's (`totals`)."""
        prompt, completion, cached = self.totals()
        out = {**usage, "prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
        details = out.get("prompt_tokens_details")
        if isinstance(details, dict) and "cached_tokens" in details:
            out["prompt_tokens_details"] = {**details, "cached_tokens": cached}
        return out


def _empty_delta(event: bytes) -> bool:
    """A chat chunk that carries only ids (vLLM sends it only when asked for them)."""
    return b'"delta":{}' in event and b'"finish_reason":null' in event and b'"usage":{' not in event
