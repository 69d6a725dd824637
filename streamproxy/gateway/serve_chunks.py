"""A `streamproxy serve` replica's chunks in a migrating stream (resume.py's `Stream` mixes this in).

Serve sends a stream's ids where it puts them (docs/api.md, "Token ids"): the prompt's on the first
chunk, each step's on its last chunk (`"token_ids":[]` on the others). For a client that did not ask
they are removed, not made null (serve sends no field unasked), and so are its id-only chunks. A step's
chunks before its last are held until it comes, so the client only ever has whole steps: a break
drops what is held and the continuation (`continue_token_ids`) makes the step again. A continuation's
chunks are the unbroken stream's but for their head (id, created): the client's is put back.

Responses and Messages streams (`blocks`: core/event_ids.py puts the ids on their events) hold the same
way, every event marked open; the replica's in-band failure (`block_error`: Messages' error of a 5xx
type, Responses' error whose response.failed says `server_error`) is the break, as chat's; their
ids (items, calls, tool_use) follow from the response's id, which
the gateway's request id makes the same on every replica. A Responses continuation's events are
numbered from 0 and carry its own `created_at`: they are numbered on from the client's next
`sequence_number` and given its `created_at` (the head kept from its `response.created`).
"""

from __future__ import annotations

import re
from array import array
from typing import Any

import orjson

_EVENT = re.compile(rb".*?(?:\r\n\r\n|\n\n)", re.S)
_SERVE_IDS = re.compile(rb',"(prompt_)?token_ids":\[([0-9, ]*)\]')
_HEAD = re.compile(rb'data: \{"id":"[^"]*","object":"[^"]*","created":\d+,')
_OPEN_STEP = b',"token_ids":[]'  # a serve chunk of a step whose ids come on a later chunk
_CREATED_AT = re.compile(rb'"created_at":\d+')  # a Responses stream's head (its response.created's)
_MESSAGE_ID = re.compile(rb'"id":"[^"]*"')  # a Messages stream's (its message_start's)
_SEQ = b'"sequence_number":'
BLOCK_ERROR = b"event: error\n"  # a block API's in-band error event (Responses: response.failed follows it)
_SERVER_TYPES = ("api_error", "overloaded_error", "timeout_error")  # Anthropic's error types of a 5xx
_SEQ_NUMBER = re.compile(rb'"sequence_number":(\d+)')
RESPONSES_KIND, MESSAGES_KIND = "responses", "messages"
# The events a block API's stream ends with (after one, the stream is whole: nothing is continued).
_ENDS = {RESPONSES_KIND: (b"event: response.completed\n", b"event: response.incomplete\n", b"event: response.failed\n"),
         MESSAGES_KIND: (b"event: message_stop\n",)}


class ServeChunks:
    """`Stream`'s serve-replica part (its attributes are Stream's)."""

    __slots__ = ("serve", "head_bytes", "rehead", "held", "blocks", "next_seq", "seq_base", "error_held")
    tracking: bool
    strip: bool
    generated: array[int]
    prompt: array[int] | None
    limit: int

    def __init__(self, blocks: str | None = None) -> None:
        self.blocks = blocks  # RESPONSES_KIND or MESSAGES_KIND: a block API's stream; None: chat or completions
        self.next_seq = 0  # Responses: the client's next event's sequence_number
        self.seq_base: int | None = None  # a Responses continuation's: what its numbers are moved by
        self.error_held = b""  # a Responses error event whose response.failed has not come (`block_error`)
        self.serve = False  # the attempt's replica is a `streamproxy serve` (its `CONTINUES` header)
        self.head_bytes = b""  # the client's chunks' head (`_HEAD`: id, object, created)
        self.rehead: tuple[bytes, bytes] | None = None  # a serve continuation's head, and the client's
        self.held: list[bytes] = []  # a serve step's chunks before the one with its ids (which ends it)

    def _untracked(self, why: str = "longer than max_tracked_tokens") -> None:
        raise NotImplementedError

    def _prompt_ids(self, ids: list[int]) -> None:
        """Keep the prompt's ids (the first seen)."""
        raise NotImplementedError

    def _serve_ids(self, block: bytes) -> bytes:
        """A serve replica's ids kept (tracking) and removed with their id-only chunks (strip). Serve puts a
        step's ids on its last chunk: the chunks before it are held until it comes (a break drops them, and
        the continuation makes the step again), so what the client has is always whole steps."""
        if self.tracking:
            out: list[bytes] = []
            for event in _EVENT.findall(block):
                if _OPEN_STEP in event and (self.blocks is not None or b'"finish_reason":null' in event):
                    self.held.append(event)
                    continue
                if self.held:
                    out.extend(self.held)
                    self.held.clear()
                out.append(event)
            block = b"".join(out)
            for match in _SERVE_IDS.finditer(block):
                ids = orjson.loads(b"[" + match[2] + b"]")
                if not match[1]:
                    self.generated.extend(ids)
                else:
                    self._prompt_ids(ids)
            if len(self.generated) + len(self.prompt or ()) > self.limit:
                self._untracked()
        if not self.strip:
            return block
        if self.blocks is not None:
            return _SERVE_IDS.sub(b"", block)  # (a block API's stream has no id-only events)
        return b"".join(e for e in _EVENT.findall(_SERVE_IDS.sub(b"", block)) if not _id_only(e))

    def _released(self) -> bytes:
        """The held events, as the client gets them (the stream ends here: a request's own error)."""
        held = b"".join(self.held)
        self.held.clear()
        return _SERVE_IDS.sub(b"", held) if self.strip else held

    def _block_head(self, block: bytes) -> bytes:
        """A block API's head, from its first event: Responses' `created_at`, Messages' id."""
        found = (_CREATED_AT if self.blocks == RESPONSES_KIND else _MESSAGE_ID).search(block)
        return found[0] if found else b""

    def _block_ended(self, block: bytes) -> bool:
        """The block holds the stream's last event (nothing is continued after it)."""
        assert self.blocks is not None
        return any(end in block for end in _ENDS[self.blocks])

    def _renumbered(self, block: bytes) -> bytes:
        """A Responses continuation's events numbered on from the client's and given its created_at."""
        base = self.seq_base
        if base is None:
            base = self.seq_base = self.next_seq
        block = _SEQ_NUMBER.sub(lambda m: _SEQ + str(int(m[1]) + base).encode(), block)
        if b'"created_at":' in block:
            block = _CREATED_AT.sub(lambda _: self.head_bytes, block)
        return block

    def client_sequence(self) -> int | None:
        """A tracked Responses stream's next sequence_number for the client (an in-band error's: after what
        it had, held events dropped, a continuation's numbered on); None: the relay's count is it."""
        if self.blocks == RESPONSES_KIND and self.serve and self.prompt is not None:
            return self.next_seq
        return None

    def _sequenced(self, block: bytes) -> None:
        """A Responses block the client gets: its last event's number, plus one, is the next."""
        found = _SEQ_NUMBER.search(block, max(0, block.rfind(_SEQ)))
        if found is not None:
            self.next_seq = int(found[1]) + 1

    def _reheaded(self, block: bytes) -> bytes:
        """A serve continuation's chunks with the client's stream's head (its id and created)."""
        if self.blocks is not None:  # (a Messages stream's ids are the same: nothing to put back)
            return self._renumbered(block) if self.blocks == RESPONSES_KIND else block
        if self.rehead is None:
            found = _HEAD.search(block)
            if found is None:
                return block
            self.rehead = (found[0], self.head_bytes)
        theirs, ours = self.rehead
        return block.replace(theirs, ours) if theirs != ours else block


def block_error(blocks: str, events: list[bytes], at: int) -> tuple[bool | None, dict[str, Any]]:
    """Whether `events[at]`, a block API's in-band error, is the replica's own failure (True: the break)
    or the request's (False: passed on), or not known yet (None: Responses' response.failed, which says,
    has not come); and the error."""
    data = payload(events[at])
    if blocks == MESSAGES_KIND:
        error = data.get("error")
        error = error if isinstance(error, dict) else {}
        return error.get("type") in _SERVER_TYPES, error
    if at + 1 >= len(events):
        return None, data
    response = payload(events[at + 1]).get("response")
    failure = response.get("error") if isinstance(response, dict) else None
    return (failure.get("code") if isinstance(failure, dict) else None) == "server_error", data


def payload(event: bytes) -> dict[str, Any]:
    """An event's JSON data ({} when it is not an object)."""
    start = event.find(b"data:")
    line_end = event.find(b"\n", start)
    try:
        data = orjson.loads(event[start + 5 : line_end if line_end >= 0 else len(event)])
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _id_only(event: bytes) -> bool:
    """A serve chunk that carries only ids (it sends none of them unasked)."""
    return (b'"delta":{},' in event or b'"text":"",' in event) and b'"finish_reason":null' in event and b'"usage":{' not in event
