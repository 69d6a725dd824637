"""Responses kept for `GET /v1/responses/{id}` (vLLM's response store), bounded in memory.

vLLM keeps a response made with `store` (its default: true) only when
VLLM_ENABLE_RESPONSES_API_STORE=1, in a dict that grows without bound. Here
the store is on with `--responses-store N` (or that variable: 1000 then),
and keeps the last N finished responses as their final JSON bytes, the
oldest dropped first. Only finished responses are kept (completed,
incomplete or failed): one whose client left mid-stream is not. Responses
are all synchronous here (background mode is refused), so a cancel finds
nothing to cancel and answers vLLM's 400. Sans-IO.
"""

from __future__ import annotations

import os
from collections import OrderedDict

from streamproxy.errors import InvalidRequest, NotFound

# The store's size when only VLLM_ENABLE_RESPONSES_API_STORE turns it on.
DEFAULT_SIZE = 1000


def size_from(setting: int) -> int:
    if setting:
        return setting
    return DEFAULT_SIZE if os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE", "").lower() in ("1", "true") else 0


class ResponseStore:
    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: OrderedDict[str, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def keep(self, response_id: str, body: bytes) -> None:
        if not self.enabled:
            return
        self._kept[response_id] = body
        self._kept.move_to_end(response_id)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def get(self, response_id: str) -> bytes:
        body = self._kept.get(response_id)
        if body is None:
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
        return body

    def cancel(self, response_id: str) -> bytes:
        self.get(response_id)
        raise InvalidRequest("Cannot cancel a synchronous response.", param="response_id")
