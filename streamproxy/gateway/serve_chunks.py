"""A `streamproxy serve` replica's chunks in a migrating stream (resume.py's `Stream` mixes this in).

Serve sends a stream's ids where it puts them (docs/api.md, "Token ids"): the prompt's on the first
chunk, each step's on its last chunk (`"token_ids":[]` on the others). For a client that did not ask
they are removed, not made null (serve sends no field unasked), and so are its id-only chunks. A step's
chunks before its last are held until it comes, so the client only ever has whole steps: a break
drops what is held and the continuation (`continue_token_ids`) makes the step again. A continuation's
chunks are the unbroken stream's but for their head (id, created): the client's is put back.
"""

from __future__ import annotations

import re
from array import array

import orjson

_EVENT = re.compile(rb".*?(?:\r\n\r\n|\n\n)", re.S)
_SERVE_IDS = re.compile(rb',"(prompt_)?token_ids":\[([0-9, ]*)\]')
_HEAD = re.compile(rb'data: \{"id":"[^"]*","object":"[^"]*","created":\d+,')
_OPEN_STEP = b',"token_ids":[]'  # a serve chunk of a step whose ids come on a later chunk


class ServeChunks:
    """`Stream`'s serve-replica part (its attributes are Stream's)."""

    __slots__ = ("serve", "head_bytes", "rehead", "held")
    tracking: bool
    strip: bool
    generated: array[int]
    prompt: array[int] | None
    limit: int

    def __init__(self) -> None:
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
                if _OPEN_STEP in event and b'"finish_reason":null' in event:
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
        return b"".join(e for e in _EVENT.findall(_SERVE_IDS.sub(b"", block)) if not _id_only(e))

    def _reheaded(self, block: bytes) -> bytes:
        """A serve continuation's chunks with the client's stream's head (its id and created)."""
        if self.rehead is None:
            found = _HEAD.search(block)
            if found is None:
                return block
            self.rehead = (found[0], self.head_bytes)
        theirs, ours = self.rehead
        return block.replace(theirs, ours) if theirs != ours else block


def _id_only(event: bytes) -> bool:
    """A serve chunk that carries only ids (it sends none of them unasked)."""
    return (b'"delta":{},' in event or b'"text":"",' in event) and b'"finish_reason":null' in event and b'"usage":{' not in event
