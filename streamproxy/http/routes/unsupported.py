"""The routes of `vllm serve`'s server that streamproxy does not serve, each answered with an
OpenAI-shaped 404 `route_not_supported` that says so and why (instead of a bare "no route").

The table is the list in docs/flags-and-routes.md; a route vLLM only has
with VLLM_SERVER_DEV_MODE=1 is here too. Served routes are in routes/__init__.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from streamproxy.errors import NotFound

_POOLING = "pooling models' scoring and classification are not served (only /v1/embeddings)"
_DEV = "a vLLM development route (VLLM_SERVER_DEV_MODE) that reaches into the engine; not served"
_RL = "vLLM's online weight-update routes for reinforcement learning are not served"
_SCALE = "vLLM's scale-out (disaggregated) routes are not served"

# (method, path, why)
UNSUPPORTED: tuple[tuple[str, str, str], ...] = (
    ("POST", "/pooling", _POOLING), ("POST", "/classify", _POOLING), ("POST", "/score", _POOLING),
    ("POST", "/v1/score", _POOLING), ("POST", "/rerank", _POOLING), ("POST", "/v1/rerank", _POOLING),
    ("POST", "/v2/rerank", _POOLING), ("POST", "/v2/embed", _POOLING),
    ("POST", "/generative_scoring", "vLLM's generative scoring is not served"),
    ("POST", "/v1/audio/transcriptions", "speech-to-text models are not served"),
    ("POST", "/v1/audio/translations", "speech-to-text models are not served"),
    ("GET", "/v1/realtime", "speech-to-text models are not served"),
    ("POST", "/v1/chat/completions/batch", "vLLM's batched chat route is not served; send one request per conversation"),
    ("POST", "/v1/systemone", "vLLM's structured-decisions route is not served"),
    ("POST", "/cohere/v2/chat", "the Cohere API is not served"),
    ("POST", "/cohere/v2/chat/render", "the Cohere API is not served"),
    ("POST", "/v1/messages/render", "render is served for /v1/chat/completions and /v1/completions only"),
    ("POST", "/v1/responses/render", "render is served for /v1/chat/completions and /v1/completions only"),
    ("POST", "/v1/chat/completions/derender", _SCALE), ("POST", "/v1/completions/derender", _SCALE),
    ("POST", "/inference/v1/generate", _SCALE), ("POST", "/inference/v1/abort_requests", _SCALE),
    ("POST", "/abort_requests", _SCALE),
    ("GET", "/tokenizer_info", "served only with --enable-tokenizer-info-endpoint (as in vLLM)"),
    ("GET", "/kv_event_sources", "vLLM's KV-cache event sources are not served"),
    ("GET", "/docs", "there is no Swagger UI; GET /openapi.json has the API"),
    ("GET", "/fault_tolerance/status", "vLLM's fault-tolerance routes are not served"),
    ("POST", "/fault_tolerance/apply", "vLLM's fault-tolerance routes are not served"),
    ("POST", "/scale_elastic_ep", "vLLM's elastic expert parallelism is not served"),
    ("POST", "/is_scaling_elastic_ep", "vLLM's elastic expert parallelism is not served"),
    ("POST", "/start_profile", "vLLM's profiler routes are not served"), ("POST", "/stop_profile", "vLLM's profiler routes are not served"),
    ("GET", "/ready", "vLLM's data-parallel supervisor's route; use /health"),
    ("GET", "/readyz", "vLLM's data-parallel supervisor's route; use /health"),
    *(("POST", p, _DEV) for p in ("/collective_rpc", "/sleep", "/wake_up", "/reset_prefix_cache", "/reset_mm_cache",
                                 "/reset_encoder_cache", "/release_kv_cache_memory")),
    ("GET", "/is_sleeping", _DEV), ("GET", "/server_info", _DEV),
    *(("POST", p, _RL) for p in ("/pause", "/resume", "/init_weight_transfer_engine", "/start_weight_update",
                                "/start_draft_weight_update", "/finish_weight_update", "/update_weights",
                                "/update_weight_version", "/shutdown_weight_transfer_engine", "/weight_checker")),
    ("GET", "/is_paused", _RL), ("GET", "/get_world_size", _RL), ("GET", "/weight_info", _RL),
)


def handler(method: str, path: str, why: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def not_supported(request: web.Request) -> web.Response:
        raise NotFound(f"{method} {path} is a route of vLLM's server that streamproxy does not support: {why}",
                       code="route_not_supported")

    return not_supported
