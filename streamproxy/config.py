"""Typed front-end settings, layered: STREAMPROXY_* env < the YAML file (--config) < CLI flags.

`Settings` is a msgspec Struct, one field per flag of ours; each field's flag
is `--field-name` and its env var `STREAMPROXY_FIELD_NAME`. The YAML file
(`--config`) may also carry vLLM engine flags: every key is turned into
`--key value` and put before the command line's own arguments, so a flag on
the command line always wins (the way `vllm serve --config` behaves).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import msgspec


class Settings(msgspec.Struct, kw_only=True):
    host: str = "0.0.0.0"
    port: int = 8000
    engine: str = "vllm"  # "vllm" or "fake"
    # Front-end processes on the one port (vLLM's --api-server-count): streamproxy/workers.py.
    api_server_count: int = 1
    model: str | None = None
    served_model_name: list[str] | None = None
    api_key: list[str] = []
    # Streaming keepalive and bounds (seconds).
    sse_heartbeat: float = 15.0
    write_stall_timeout: float = 30.0
    # Write each engine step straight to the socket from the engine's step while the client keeps up.
    stream_push: bool = True
    # vLLM: one-choice requests without logprobs go from the engine core straight to their streams (engine_adapter/vllm_direct.py).
    direct_outputs: bool = True
    nonstream_keepalive_after: float = 60.0
    nonstream_keepalive_interval: float = 15.0
    request_timeout: float = 600.0
    drain_timeout: float = 30.0
    engine_start_timeout: float = 1800.0
    # After the engine dies: seconds of 503 `engine_dead` (in-flight requests end their error path), then exit 1.
    engine_death_grace: float = 2.0
    # Size and count limits.
    max_body_bytes: int = 8 * 1024 * 1024
    max_n: int = 16
    max_concurrent_requests: int = 0  # 0: unlimited
    max_queued_requests: int = 0
    max_header_bytes: int = 16384  # per request line and per header field
    max_header_count: int = 256  # header fields per request (vLLM's --h11-max-header-count default)
    # Client timeouts and the connection cap, named after nginx's directives and with its defaults (seconds).
    client_header_timeout: float = 60.0  # 0: none
    client_body_timeout: float = 60.0  # between two reads of the body; 0: none
    keepalive_timeout: float = 75.0  # an idle connection between requests; 0: no keep-alive
    max_connections: int | None = None  # None: half the file-descriptor limit (http/connection.py); 0: no cap
    # Security: which open routes need the key too; CORS (off unless origins are given).
    health_requires_api_key: bool = False
    metrics_requires_api_key: bool = False
    allowed_origins: list[str] = []
    allowed_methods: list[str] = msgspec.field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = msgspec.field(default_factory=lambda: ["*"])
    allow_credentials: bool = False
    # Observability.
    access_log: str = "stdout"  # stdout, stderr, a file path, or off
    disable_access_log_for_endpoints: str | None = None  # vLLM's flag: comma-separated paths without a line
    # serve: the request ledger (sqlite:///path or postgresql://...; http/books.py); off when None.
    ledger: str | None = None
    log_error_stack: bool = False
    enable_log_outputs: bool = False  # vLLM's flag: the generated text in the access-log line
    max_log_len: int | None = None  # vLLM's flag: at most this many characters of it per choice  # vLLM's flag: every error response is logged with its stack
    http_log_level: str | None = None  # aiohttp's own loggers (vLLM's --uvicorn-log-level sets it)
    # vLLM's front-end flags (streamproxy/frontend_flags.py): the path prefix of a path-routing proxy, no /openapi.json.
    root_path: str | None = None
    # TLS and a Unix socket, as vLLM's flags (streamproxy/http/tls.py).
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0  # ssl.CERT_NONE; 2: mutual TLS
    ssl_ciphers: str | None = None
    enable_ssl_refresh: bool = False
    uds: str | None = None
    disable_fastapi_docs: bool = False
    deprecated: list[str] = []  # "/route" or "/route#field", optionally "@YYYY-MM-DD"
    deprecation_link: str | None = None
    # Tool calling in tool_choice "auto" (as in vLLM): a parser for the model's tool-call syntax.
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    # Reasoning models (as in vLLM): the parser that splits the thinking from the answer,
    # whether it is also sent under its older name, and chat template kwargs for every request.
    reasoning_parser: str | None = None
    reasoning_content_field: bool = True
    default_chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's --reasoning-effort-map: a request's reasoning_effort rewritten before the chat template sees it.
    reasoning_effort_map: dict[str, str] | None = None
    # Chat templates and answers, as vLLM's flags of the same names (streamproxy/core/chat_template.py).
    chat_template: str | None = None
    chat_template_content_format: str = "auto"
    trust_request_chat_template: bool = False
    response_role: str = "assistant"
    return_tokens_as_token_ids: bool = False
    enable_force_include_usage: bool = False
    exclude_tools_when_tool_choice_none: bool = False
    enable_server_load_tracking: bool = False
    enable_tokenizer_info_endpoint: bool = False
    # Responses made with `store` kept for GET /v1/responses/{id} (0: none; apis/responses/store.py).
    responses_store: int = 0
    # LoRA adapters served beside the model (as in vLLM): `name=path` or JSON objects (streamproxy/core/adapters.py).
    lora_modules: list[str] = []
    # Fake engine knobs (--engine fake).
    fake_ttft: float = 0.0
    fake_token_delay: float = 0.0
    fake_text: str = "Hello! This is a fake streamed answer. "
    fake_fail_after: int | None = None
    fake_fail_on: str | None = None
    fake_crash_on: str | None = None
    fake_max_model_len: int = 4096
    fake_boot_delay: float = 0.0
    # Gateway: the key of the admin routes (POST /v1/deployments/{id}/wake|park); none: they answer 401.
    admin_key: str | None = None
    # OTLP endpoint for traces (vLLM's flag; serve passes it on to vLLM's engine too). None: no tracing.
    otlp_traces_endpoint: str | None = None
    log_level: str = "info"


# Flags of ours and how argparse reads them (type, action, help).
_FLAG_HELP: dict[str, str] = {
    "host": "address to listen on",
    "port": "port to listen on",
    "engine": "vllm (embedded vLLM AsyncLLM) or fake (scripted, for tests/benchmarks)",
    "api_server_count": "front-end processes serving the one port (as vllm serve's flag): with vLLM they share "
    "the engine core(s), with --engine fake each has its own fake engine; limits are split between them "
    "(docs/serving.md: when to raise it)",
    "api_key": "API key clients must send as 'Authorization: Bearer'; repeatable (env STREAMPROXY_API_KEY, or @file)",
    "sse_heartbeat": "seconds of silence on a stream before an SSE keepalive comment",
    "write_stall_timeout": "seconds a stream may wait on a client that does not read before it is ended",
    "direct_outputs": "vLLM engine: serve generation requests (any n, logprobs too) from the engine core's outputs "
    "directly instead of through vLLM's OutputProcessor (--no-direct-outputs: vLLM's path for all)",
    "stream_push": "write each engine step to the socket from the engine's step while the client keeps up "
    "(--no-stream-push: always from the request's task)",
    "nonstream_keepalive_after": "seconds before a non-streaming answer starts sending keepalive whitespace",
    "nonstream_keepalive_interval": "seconds between keepalive newlines of a non-streaming answer",
    "request_timeout": "seconds after which a non-streaming request is aborted",
    "drain_timeout": "seconds in-flight requests may finish after SIGTERM",
    "engine_start_timeout": "seconds the engine may take to load before the server gives up and exits 1",
    "engine_death_grace": "seconds the server lingers after its engine died (new requests: 503 engine_dead; "
    "in-flight ones end with an error) before it exits 1 for its supervisor to restart it",
    "max_body_bytes": "largest request body accepted",
    "max_n": "largest 'n' accepted",
    "max_concurrent_requests": "requests generated at once (0: no limit)",
    "max_queued_requests": "requests that may wait for a slot",
    "max_header_bytes": "longest request line or header field accepted (431 beyond)",
    "max_header_count": "most header fields a request may have (431 beyond; vLLM's --h11-max-header-count)",
    "client_header_timeout": "seconds a client may take to send a request's headers (nginx's client_header_timeout; "
    "408 and close, or only a close if it sent nothing; 0: no limit)",
    "client_body_timeout": "seconds between two reads of a request body before the request ends (nginx's "
    "client_body_timeout; 408 and close; 0: no limit)",
    "keepalive_timeout": "seconds an idle keep-alive connection is kept open between requests (nginx's "
    "keepalive_timeout; 0: close after each response)",
    "max_connections": "client connections open at once; past it new ones are closed at once (default: half "
    "the process's file-descriptor limit, `ulimit -n`; 0: no cap)",
    "health_requires_api_key": "/health needs the API key too",
    "metrics_requires_api_key": "/metrics needs the API key too",
    "allowed_origins": "CORS: origins allowed to read responses (JSON list or comma-separated; '*' any); off when empty",
    "allowed_methods": "CORS: allowed methods (default '*')",
    "allowed_headers": "CORS: allowed request headers (default '*')",
    "allow_credentials": "CORS: allow credentials",
    "access_log": "JSON access log: stdout, stderr, a file path, or off",
    "disable_access_log_for_endpoints": "comma-separated paths (e.g. /health,/metrics) that get no access-log line",
    "ledger": "serve: the request ledger, one record per generation request with its tokens: sqlite:///path/ledger.db "
    "or postgresql://user@host/db (off by default, also when $STREAMPROXY_LEDGER, the gateway's default, is set; "
    "read it with `streamproxy usage --ledger URL`)",
    "enable_log_outputs": "put each request's generated text in its access-log line (`output`; as vLLM's flag)",
    "max_log_len": "at most this many characters of a choice's text in the log (with --enable-log-outputs)",
    "log_error_stack": "log every error response with its stack trace (as vLLM's flag)",
    "http_log_level": "level of aiohttp's own loggers (vLLM's --uvicorn-log-level sets it too)",
    "root_path": "path prefix of a path-routing proxy in front (as vLLM's flag): every route also answers under it",
    "disable_fastapi_docs": "no GET /openapi.json (vLLM's flag)",
    "ssl_keyfile": "TLS: the private key file (as vLLM's flag)",
    "ssl_certfile": "TLS: the certificate (chain) file; serve HTTPS (as vLLM's flag)",
    "ssl_ca_certs": "TLS: the CA certificates client certificates must chain to (as vLLM's flag)",
    "ssl_cert_reqs": "TLS: client certificates: 0 not asked, 1 optional, 2 required (mutual TLS; as vLLM's flag)",
    "ssl_ciphers": "TLS: cipher suites for TLS 1.2 and below (OpenSSL cipher list; as vLLM's flag)",
    "enable_ssl_refresh": "TLS: reload the certificate files when they change (as vLLM's flag)",
    "uds": "listen on this Unix socket path instead of --host/--port (as vLLM's flag)",
    "deprecated": "mark a route (/v1/completions) or field (/v1/chat/completions#max_tokens) deprecated, optionally @YYYY-MM-DD; repeatable",
    "deprecation_link": "URL sent as Link rel=deprecation with the Deprecation header",
    "enable_auto_tool_choice": "let the model call tools on its own (tool_choice auto); needs --tool-call-parser",
    "tool_call_parser": "parser for the model's tool-call syntax: hermes, llama3_json, mistral, pythonic, "
    "any name in vLLM's tool-parser registry, or auto (read from the model's chat template)",
    "reasoning_parser": "split the model's thinking into message.reasoning: qwen3, deepseek_r1, "
    "any name in vLLM's reasoning-parser registry, or auto (read from the model's chat template)",
    "reasoning_content_field": "also send the reasoning as `reasoning_content` (the older name LangChain, "
    "LlamaIndex and SGLang clients read); --no-reasoning-content-field sends only `reasoning`",
    "default_chat_template_kwargs": "JSON object of chat template kwargs for every request (e.g. "
    "'{\"enable_thinking\": false}'); a request's own chat_template_kwargs win",
    "reasoning_effort_map": "JSON object rewriting a request's reasoning_effort to one the chat template knows, "
    "before the template sees it, on chat, Responses and Messages (e.g. '{\"medium\": \"low\", \"xhigh\": \"max\"}'; "
    "efforts not listed pass unchanged; as vLLM's flag)",
    "chat_template": "the chat template: a file, or the template itself (as vLLM's flag); default: the model's",
    "chat_template_content_format": "how message content reaches the template: string, openai (a list of parts) "
    "or auto (read from the template), as vLLM's flag",
    "trust_request_chat_template": "let a request bring its own chat_template (refused with a 400 otherwise, as vLLM)",
    "response_role": "the role of the answer's message (as vLLM's flag)",
    "return_tokens_as_token_ids": "logprobs name each token 'token_id:N' (as vLLM's flag)",
    "enable_force_include_usage": "every answer carries usage, streams a usage chunk too (as vLLM's flag)",
    "exclude_tools_when_tool_choice_none": "tool_choice none: the tools are not shown to the chat template (as vLLM's flag)",
    "responses_store": "keep the last N responses made with store (OpenAI's default) for GET /v1/responses/{id} "
    "(0: none, unless VLLM_ENABLE_RESPONSES_API_STORE=1, which keeps 1000, as vLLM's switch)",
    "enable_tokenizer_info_endpoint": "serve GET /tokenizer_info (as vLLM's flag; it shows the chat template)",
    "enable_server_load_tracking": "count requests in flight for GET /load (as vLLM's flag)",
    "lora_modules": "LoRA adapters to serve, each a model name of its own (as vLLM's flag): 'name=path' or JSON "
    "'{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'; several per flag, or the flag repeated "
    "(vLLM engine: needs --enable-lora; VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 adds POST /v1/load_lora_adapter "
    "and /v1/unload_lora_adapter)",
    "fake_ttft": "fake engine: seconds before the first token",
    "fake_token_delay": "fake engine: seconds between tokens",
    "fake_text": "fake engine: text repeated until max_tokens",
    "fake_fail_after": "fake engine: fail every request after N tokens",
    "fake_fail_on": "fake engine: --fake-fail-after applies only to requests whose prompt contains this text",
    "fake_crash_on": "fake engine: a step serving a request whose prompt contains this text raises, and the engine dies",
    "fake_max_model_len": "fake engine: context length",
    "fake_boot_delay": "fake engine: seconds the engine takes to load (/health is 503 meanwhile)",
    "admin_key": "gateway: key for POST /v1/deployments/{id}/wake and /park (env STREAMPROXY_ADMIN_KEY)",
    "log_level": "debug, info, warning, error",
    "otlp_traces_endpoint": "OpenTelemetry: send a span per request to this OTLP endpoint (gRPC, or HTTP with "
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf); W3C traceparent honoured and passed on (docs/observability.md)",
}


# Flags with no STREAMPROXY_* variable.
_NO_ENV = frozenset({"ledger"})


def add_arguments(parser: argparse.ArgumentParser, *, with_model_flags: bool) -> None:
    """Add our flags; `--model`/`--served-model-name` only when vLLM's args are absent."""
    defaults = Settings()
    taken = getattr(parser, "_option_string_actions", {})
    for name, help_text in _FLAG_HELP.items():
        default = getattr(defaults, name)
        flag = "--" + name.replace("_", "-")
        if flag in taken:
            continue  # vLLM defines it (e.g. --log-level): its definition wins
        # $STREAMPROXY_LEDGER is the gateway's default ledger: serve's stays off unless --ledger names one.
        env_default = None if name in _NO_ENV else os.environ.get("STREAMPROXY_" + name.upper())
        if name in ("api_key", "lora_modules"):  # vLLM's form: several values per flag, each kept whole (JSON has commas)
            parser.add_argument(flag, nargs="+", action="append", default=None, help=help_text)
            continue
        if isinstance(default, list):
            # Repeatable; None means "not given" (the Settings default applies).
            env_list = [_list_value(env_default)] if env_default is not None else None
            parser.add_argument(flag, action="append", type=_list_value, default=env_list, help=help_text)
            continue
        if isinstance(default, bool):
            if env_default is not None:
                default = env_default.strip().lower() in ("1", "true", "yes", "on")
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
            continue
        kind: Any = type(default) if default is not None else _FLAG_TYPE.get(name, int)
        if env_default is not None:
            default = kind(env_default)
        parser.add_argument(flag, type=kind, default=default, help=help_text)
    if with_model_flags:
        parser.add_argument("--model", default=None, help="model folder or hub id")
        parser.add_argument("--served-model-name", nargs="+", default=None, help="name(s) the model is served under")


# List settings given as a repeated flag (a YAML list becomes `--flag a --flag b`).
_REPEATABLE = {name for name in Settings.__struct_fields__ if isinstance(getattr(Settings(), name), list)}


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


# Flags whose default is None and whose values are not ints.
_FLAG_TYPE: dict[str, Any] = {
    "deprecation_link": str,
    "admin_key": str,
    "otlp_traces_endpoint": str,
    "fake_fail_on": str,
    "fake_crash_on": str,
    "tool_call_parser": str,
    "reasoning_parser": str,
    "chat_template": str,
    "root_path": str,
    "ssl_keyfile": str,
    "ssl_certfile": str,
    "ssl_ca_certs": str,
    "ssl_ciphers": str,
    "uds": str,
    "http_log_level": str,
    "disable_access_log_for_endpoints": str,
    "ledger": str,
    "default_chat_template_kwargs": _json_object,
    "reasoning_effort_map": _json_object,
}


def _list_value(text: str) -> list[str]:
    """vLLM's form (a JSON list, e.g. '["https://a.example"]') or comma-separated."""
    text = text.strip()
    if text.startswith("["):
        return [str(v) for v in json.loads(text)]
    return [part.strip() for part in text.split(",") if part.strip()]


def settings_from_namespace(ns: argparse.Namespace) -> Settings:
    values = {f: getattr(ns, f) for f in Settings.__struct_fields__ if hasattr(ns, f)}
    defaults = Settings()
    for name, value in list(values.items()):
        if isinstance(getattr(defaults, name), list):
            if value is None:
                del values[name]
            else:
                values[name] = [item for group in value for item in group]
    keys: list[str] = []
    for key in values.pop("api_key", None) or []:
        keys.extend(_read_key(key))
    for env in ("STREAMPROXY_API_KEY", "VLLM_API_KEY"):  # vllm serve reads VLLM_API_KEY
        env_key = os.environ.get(env)
        if env_key:
            keys.append(env_key)
    return Settings(api_key=keys, **values)


def _read_key(value: str) -> list[str]:
    if value.startswith("@"):
        text = Path(value[1:]).read_text()
        return [line.strip() for line in text.splitlines() if line.strip()]
    return [value]


def expand_config_file(argv: list[str]) -> list[str]:
    """Replace `--config FILE` with the YAML's keys as flags, ahead of the rest."""
    if "--config" not in argv:
        return argv
    at = argv.index("--config")
    if at + 1 >= len(argv):
        raise SystemExit("--config needs a file")
    import yaml

    data = yaml.safe_load(Path(argv[at + 1]).read_text()) or {}
    rest = argv[:at] + argv[at + 2 :]
    flags = mapping_to_flags(data)
    # Subcommand (e.g. "serve") stays first.
    head = rest[:1] if rest and not rest[0].startswith("-") else []
    return head + flags + rest[len(head) :]


def mapping_to_flags(data: dict[str, Any]) -> list[str]:
    """A config file's keys as command-line flags (`key: value` -> `--key value`)."""
    flags: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]  # e.g. default_chat_template_kwargs
        elif isinstance(value, list):
            if str(key).replace("-", "_") in _REPEATABLE:
                for v in value:
                    flags += [flag, str(v)]
            else:
                flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags
