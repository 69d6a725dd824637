"""`vllm serve`'s front-end flags: what each one means to `streamproxy serve`.

With `--engine vllm` the parser takes every front-end option of vLLM's `make_arg_parser` we do not
define (vllm_cli.py), so a `vllm serve` script parses. `FLAGS` decides each `dest`: `ours` (a Settings
field, vLLM's meaning), `alias` (`ALIASES` converts it), `engine` (passed to vLLM's engine), `same`
(already behaves so) or `refused` (a non-default value stops the start). `since`/`until` bound the vLLM
releases a flag exists in; `neutral` lists values meaning the default. tests/unit/test_frontend_flags.py
fails on a new vLLM flag with no entry. Nothing here imports vLLM.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from streamproxy.config import Settings

Kind = Literal["ours", "alias", "engine", "same", "refused"]


@dataclass(frozen=True, slots=True)
class Flag:
    kind: Kind
    note: str  # what it means here (ours/alias/engine/same) or why it is refused
    since: str | None = None  # the first vLLM release ("0.33") whose `vllm serve` has the flag (None: every supported one)
    until: str | None = None  # the first release that no longer has it
    neutral: tuple[Any, ...] = ()  # values other than vLLM's default that mean the same here


def _ours(note: str = "as in vllm serve", **release: Any) -> Flag:
    return Flag("ours", note, **release)


def _refused(why: str, **release: Any) -> Flag:
    return Flag("refused", why, **release)


FLAGS: dict[str, Flag] = {
    # Launcher options of `vllm serve` itself.
    "model_tag": _ours("the model (positional), as --model"),
    "config": _ours("a YAML file of flags (config.expand_config_file)"),
    "api_server_count": _ours("front-end processes on the one port (streamproxy/workers.py)"),
    "headless": _refused("runs vLLM's engine cores without an API server (multi-node data parallel); "
                         "streamproxy serve is the API server: run `vllm serve --headless` on those nodes"),
    "grpc": _refused("serves vLLM's gRPC API instead of HTTP; streamproxy serves HTTP only"),
    "grpc_port": _refused("the Rust front end's gRPC services; streamproxy serves HTTP only"),
    # Where and how to listen.
    "host": _ours(), "port": _ours(),
    "uds": _ours("a Unix socket instead of --host/--port (not with --api-server-count above 1)"),
    "root_path": _ours("the path prefix of a path-routing proxy: routes answer with and without it"),
    "ssl_keyfile": _ours("HTTPS (streamproxy/http/tls.py)"),
    "ssl_certfile": _ours("HTTPS (streamproxy/http/tls.py)"),
    "ssl_ca_certs": _ours("the CAs client certificates must chain to"),
    "ssl_cert_reqs": _ours("2: mutual TLS, a client without a certificate is refused"),
    "ssl_ciphers": _ours(),
    "enable_ssl_refresh": _ours("the certificate files are reloaded when they change (checked every 2 s)"),
    "h11_max_incomplete_event_size": Flag("alias", "--max-header-bytes: the longest request line or header accepted"),
    "h11_max_header_count": Flag("alias", "--max-header-count: the most header fields a request may have"),
    "data_parallel_supervisor_port": _refused("vLLM's health supervisor of multi-port external load balancing; "
                                              "not part of streamproxy"),
    "dp_supervisor_probe_interval_s": _refused("vLLM's multi-port external load-balancing supervisor; not part of streamproxy"),
    "dp_supervisor_probe_timeout_s": _refused("vLLM's multi-port external load-balancing supervisor; not part of streamproxy"),
    "dp_supervisor_probe_failure_threshold": _refused("vLLM's multi-port external load-balancing supervisor; "
                                                      "not part of streamproxy"),
    # The HTTP edge.
    "allow_credentials": _ours(), "allowed_origins": _ours(), "allowed_methods": _ours(), "allowed_headers": _ours(),
    "api_key": _ours("also guards every route but /health, /metrics, /ping, /version and /openapi.json"),
    "middleware": _refused("loads FastAPI/ASGI middleware; streamproxy is an aiohttp server, not FastAPI"),
    "enable_request_id_headers": Flag("same", "every response carries X-Request-Id"),
    "disable_fastapi_docs": _ours("no /openapi.json (there is no Swagger UI or ReDoc to turn off)"),
    "enable_offline_docs": _refused("serves Swagger UI from vendored assets; streamproxy serves /openapi.json only"),
    "sse_keep_alive_interval": Flag("alias", "--sse-heartbeat N; vLLM's default 0 leaves ours on (15 s): "
                                                "--sse-heartbeat 0 turns it off"),
    "uvicorn_log_level": Flag("alias", "the level of aiohttp's own loggers (there is no uvicorn)"),
    "disable_uvicorn_access_log": Flag("alias", "--access-log off"),
    "disable_access_log_for_endpoints": _ours("no access-log line for these paths (comma-separated)"),
    "log_error_stack": _ours("log every error response with its stack"),
    # Logging of requests.
    "max_log_len": _ours("at most this many characters of each choice's text in the access log (no log line "
                         "carries prompt text)"),
    "enable_log_outputs": _ours("the generated text in each request's access-log line (`output`); "
                                "--enable-log-requests is not needed"),
    "enable_log_deltas": Flag("same", "no output deltas are ever logged"),
    # Chat templates.
    "chat_template": _ours("a file, or the template itself inline"),
    "chat_template_content_format": _ours(), "trust_request_chat_template": _ours(),
    "default_chat_template_kwargs": _ours(),
    "reasoning_effort_map": _ours("a request's reasoning_effort is rewritten before the chat template sees it, "
                                  "on chat, Responses and Messages", since="0.33"),
    "cohere_format": Flag("alias", "added to --default-chat-template-kwargs as cohere_format, as vLLM does"),
    "response_role": _ours(),
    "trust_request_mm_kwargs": _refused("multimodal inputs are not served (text-only)"),
    # Answers.
    "return_tokens_as_token_ids": _ours(),
    "enable_prompt_tokens_details": Flag("same", "usage always has prompt_tokens_details.cached_tokens"),
    "enable_force_include_usage": _ours(),
    "enable_per_request_metrics": _refused("vLLM's per-request timing fields are not in streamproxy's answers; "
                                           "the access log has ttft_ms and duration_ms"),
    "fingerprint_mode": _refused("system_fingerprint is streamproxy's own fixed value"),
    "fingerprint_value": _refused("system_fingerprint is streamproxy's own fixed value"),
    # Tools.
    "enable_auto_tool_choice": _ours(), "tool_call_parser": _ours(), "exclude_tools_when_tool_choice_none": _ours(),
    "tool_parser_plugin": Flag("engine", "the plugin file is imported into vLLM's tool-parser registry"),
    "tool_strict_level": _refused("vLLM's structural-tag tool calling; streamproxy constrains required and "
                                  "named tool calls with its own emitters",
                                  neutral=("auto",)),  # 0.32's default; from 0.33 unset means the parser's own (auto)
    "tool_server": _refused("built-in and MCP tool servers of the Responses API are not supported"),
    # Routes.
    "lora_modules": _ours(),
    "enable_server_load_tracking": _ours("GET /load"),
    "enable_tokenizer_info_endpoint": _ours("GET /tokenizer_info"),
    "tokens_only": _refused("vLLM's disaggregated Tokens In<>Out server; not part of streamproxy"),
    "enable_scale_out": _refused("the render routes are always served here, but vLLM's other scale-out routes "
                                 "(/derender, /inference/v1/generate) are not"),
    "cohere_is_reasoning_model": _refused("the Cohere API (/cohere/v2/chat) is not served"),
    "anthropic_disabled_thinking_effort": _refused("streamproxy's /v1/messages turns thinking off with "
                                                   "enable_thinking: false for thinking disabled"),
    "enable_flash_late_interaction": Flag("engine", "passed on to the engine's pooler config, as vLLM does"),
}


def _sse(settings: Settings, value: Any) -> None:
    settings.sse_heartbeat = float(value)


def _header_bytes(settings: Settings, value: Any) -> None:
    settings.max_header_bytes = int(value)


def _header_count(settings: Settings, value: Any) -> None:
    settings.max_header_count = int(value)


def _http_log_level(settings: Settings, value: Any) -> None:
    settings.http_log_level = str(value)


def _no_access_log(settings: Settings, value: Any) -> None:
    if value:
        settings.access_log = "off"


def _cohere_format(settings: Settings, value: Any) -> None:
    kwargs = dict(settings.default_chat_template_kwargs or {})
    kwargs.setdefault("cohere_format", value)
    settings.default_chat_template_kwargs = kwargs


# alias dest -> what a value other than vLLM's default does to our settings.
ALIASES: dict[str, Callable[[Settings, Any], None]] = {
    "sse_keep_alive_interval": _sse,
    "h11_max_incomplete_event_size": _header_bytes,
    "h11_max_header_count": _header_count,
    "uvicorn_log_level": _http_log_level,
    "disable_uvicorn_access_log": _no_access_log,
    "cohere_format": _cohere_format,
}


def option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def apply(ns: argparse.Namespace, defaults: Mapping[str, Any], settings: Settings) -> None:
    """vLLM's front-end flags in `ns` (their vLLM defaults in `defaults`): refuse those we do not
    support (SystemExit naming the flag), set our settings from the aliases."""
    for dest, default in defaults.items():
        if not hasattr(ns, dest):
            continue
        value = getattr(ns, dest)
        if value == default:
            continue
        flag = FLAGS.get(dest)
        if flag is not None and value in flag.neutral:
            continue
        if flag is None:
            raise SystemExit(f"{option(dest)}: a vLLM front-end flag streamproxy has not decided about (newer vLLM?)")
        if flag.kind == "refused":
            raise SystemExit(f"{option(dest)} is not supported by streamproxy serve: {flag.note}")
        if flag.kind == "alias":
            ALIASES[dest](settings, value)
