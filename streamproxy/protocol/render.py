"""Wire schema of vLLM's render routes (`/v1/chat/completions/render`, `/v1/completions/render`)
and of `GET /load`: vLLM's `GenerateRequest` fields that streamproxy fills, and `{"server_load": N}`."""

from __future__ import annotations

from typing import Any

import msgspec

from streamproxy.protocol.common import StreamOptions


class RenderedRequest(msgspec.Struct):
    request_id: str
    token_ids: list[int]
    # The engine's sampling parameters, named as vLLM's SamplingParams names them.
    sampling_params: dict[str, Any]
    model: str | None
    stream: bool
    stream_options: StreamOptions | None


class ServerLoad(msgspec.Struct):
    server_load: int
