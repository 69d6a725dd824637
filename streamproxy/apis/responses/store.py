"""Responses kept for `GET /v1/responses/{id}` (vLLM's response store), bounded in memory.

vLLM keeps a response made with `store` (its default: true) only when
VLLM_ENABLE_RESPONSES_API_STORE=1, in a dict that grows without bound. Here
the store is on with `--responses-store N` (or that variable: 1000 then),
and keeps the last N responses, the oldest finished one dropped first.
A finished response (completed, incomplete, failed, cancelled) is kept as
its final JSON bytes; one whose client left mid-stream is not. A background
response (`background: true`) is kept from its create on as a `Live` entry
that says its current state; it is never dropped while it runs, and at most
N run at once (the N+1st create is a 429). When it ends its final bytes
replace it. Cancelling a finished response (a synchronous one, or a
background one that ended) is vLLM's 400. Sans-IO: the route does the awaiting.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Protocol

from streamproxy.errors import InvalidRequest, NotFound, RateLimited

# The store's size when only VLLM_ENABLE_RESPONSES_API_STORE turns it on.
DEFAULT_SIZE = 1000


def size_from(setting: int) -> int:
    if setting:
        return setting
    return DEFAULT_SIZE if os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE", "").lower() in ("1", "true") else 0


class Live(Protocol):
    """A background response while it runs."""

    def snapshot(self) -> bytes:
        """Its JSON as it stands (queued, or in_progress with the output so far)."""
        ...


class ResponseStore:
    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: OrderedDict[str, bytes | Live] = OrderedDict()
        self._live = 0

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def enabled(self) -> bool:
        return self.size > 0

    @property
    def running(self) -> int:
        """Background responses running now."""
        return self._live

    def keep(self, response_id: str, body: bytes) -> None:
        """Keep a finished response (replacing its `Live` entry, if it ran in the background)."""
        if not self.enabled:
            return
        self._put(response_id, body)

    def start(self, response_id: str, live: Live) -> None:
        """Keep a background response from its create on; 429 when `size` already run."""
        if self._live >= self.size:
            raise RateLimited(
                f"too many background responses running (at most {self.size}, the --responses-store size); retry later"
            )
        self._put(response_id, live)
        self._live += 1

    def _put(self, response_id: str, entry: bytes | Live) -> None:
        old = self._kept.get(response_id)
        if old is not None and not isinstance(old, bytes):
            self._live -= 1
        self._kept[response_id] = entry
        self._kept.move_to_end(response_id)
        while len(self._kept) > self.size:
            victim = next((rid for rid, e in self._kept.items() if isinstance(e, bytes)), None)
            if victim is None:  # all running: `start` keeps them to `size`
                break
            del self._kept[victim]

    def entry(self, response_id: str) -> bytes | Live:
        found = self._kept.get(response_id)
        if found is None:
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
        return found

    def get(self, response_id: str) -> bytes:
        found = self.entry(response_id)
        return found if isinstance(found, bytes) else found.snapshot()

    def cancellable(self, response_id: str) -> Live:
        """The running background response `cancel` may end; vLLM's 404 or 400 otherwise."""
        found = self.entry(response_id)
        if isinstance(found, bytes):
            raise InvalidRequest("Cannot cancel a synchronous response.", param="response_id")
        return found
