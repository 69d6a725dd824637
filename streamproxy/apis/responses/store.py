"""Responses kept for `GET /v1/responses/{id}` (vLLM's response store), bounded in memory.

On with `--responses-store N` (or VLLM_ENABLE_RESPONSES_API_STORE=1: 1000), keeping the last N, oldest
finished first out. A finished response is kept as its final JSON bytes (not one whose client left
mid-stream). A background response is a `Live` entry from its create on, never dropped while it runs,
at most N at once (then 429); at its `end` its bytes replace it, or a streamed one's entry stays for
replays. Cancelling a finished response is vLLM's 400. Sans-IO.
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
        self._running: set[str] = set()

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def enabled(self) -> bool:
        return self.size > 0

    @property
    def running(self) -> int:
        """Background responses running now."""
        return len(self._running)

    def keep(self, response_id: str, body: bytes) -> None:
        """Keep a finished response (not over a background one running under the same id)."""
        if not self.enabled or response_id in self._running:
            return
        self._put(response_id, body)

    def start(self, response_id: str, live: Live) -> None:
        """Keep a background response from its create on; 429 when `size` already run."""
        if len(self._running) >= self.size or response_id in self._running:
            raise RateLimited(
                f"too many background responses running (at most {self.size}, the --responses-store size); retry later"
            )
        self._put(response_id, live)
        self._running.add(response_id)

    def end(self, response_id: str, body: bytes | None) -> None:
        """A background response ended: `body` replaces its entry, or (None) the entry stays."""
        self._running.discard(response_id)
        if body is not None:
            self._put(response_id, body)

    def _put(self, response_id: str, entry: bytes | Live) -> None:
        self._kept[response_id] = entry
        self._kept.move_to_end(response_id)
        while len(self._kept) > self.size:
            victim = next((rid for rid in self._kept if rid not in self._running), None)
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
        if isinstance(found, bytes) or response_id not in self._running:
            raise InvalidRequest("Cannot cancel a synchronous response.", param="response_id")
        return found
