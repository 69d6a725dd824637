"""Typed front-end settings, layered: STREAMPROXY_* env < the YAML file (--config) < CLI flags.

`Settings` has one field per flag of ours, each declaring its flag (`Annotated[T, Flag(...)]`): type,
default, help, env name (`STREAMPROXY_FIELD_NAME` by default) and commands. `FLAGS` reads them once,
and the parsers (`add_arguments`), the config-file reader (`mapping_to_flags`), the gateway's refusal
of serve's flags (`serve_only_refusal`) and docs/cli.md come from it. The type decides parsing: bool
`--x`/`--no-x`, list repeatable (JSON or commas; `words`: vLLM's several-per-flag), dict JSON,
`T | None` a T. YAML keys become `--key value` before the command line's own, which always win.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec

SERVE = frozenset({"serve"})
BOTH = frozenset({"serve", "gateway"})


@dataclass(frozen=True, slots=True)
class Flag:
    """A flag of ours, declared on its `Settings` field."""

    help: str
    env: str | None = ""  # its variable ("": STREAMPROXY_<NAME>; None: none)
    commands: frozenset[str] = BOTH  # a flag of serve only, given to the gateway, stops it with `refusal`
    refusal: str = "the gateway does not support it"
    words: bool = False  # a list: vLLM's nargs="+", each value whole (JSON has commas), not split at commas
    repeat: bool = True  # a list: a repeated flag adds its values (False: the last one counts)
    # From the field (`FLAGS`):
    name: str = ""
    kind: Any = None  # bool, list, dict, int, float or str
    default: Any = None

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")


class Settings(msgspec.Struct, kw_only=True):
    host: Annotated[str, Flag("address to listen on")] = "0.0.0.0"
    port: Annotated[int, Flag("port to listen on")] = 8000
    engine: Annotated[str, Flag("vllm (embedded vLLM AsyncLLM) or fake (scripted, for tests/benchmarks)")] = "vllm"
    api_server_count: Annotated[int, Flag(
        "front-end processes serving the one port (as vllm serve's flag): with vLLM they share the engine core(s), with "
        "--engine fake each has its own fake engine; limits are split between them (docs/serving.md: when to raise it)")] = 1
    # vLLM's own flags (engine_adapter/vllm_cli.py), ours with --engine fake.
    model: Annotated[str | None, Flag("model folder or hub id", env=None, commands=SERVE)] = None
    served_model_name: Annotated[list[str] | None, Flag(
        "name(s) the model is served under", env=None, commands=SERVE, words=True, repeat=False)] = None
    api_key: Annotated[list[str], Flag(
        "API key clients must send as 'Authorization: Bearer'; repeatable, or @file (a key a line); $STREAMPROXY_API_KEY "
        "and $VLLM_API_KEY (as vllm serve) add one each", words=True)] = []
    # Streaming keepalive and bounds (seconds).
    sse_heartbeat: Annotated[float, Flag("seconds of silence on a stream before an SSE keepalive comment")] = 15.0
    write_stall_timeout: Annotated[float, Flag(
        "seconds a stream may wait on a client that does not read before it is ended")] = 30.0
    stream_push: Annotated[bool, Flag(
        "write each engine step to the socket from the engine's step while the client keeps up "
        "(--no-stream-push: always from the request's task)")] = True
    direct_outputs: Annotated[bool, Flag(
        "vLLM engine: serve generation requests (any n, logprobs too) from the engine core's outputs directly instead "
        "of through vLLM's OutputProcessor (engine_adapter/vllm_direct.py; --no-direct-outputs: vLLM's path for all)")] = True
    nonstream_keepalive_after: Annotated[float, Flag(
        "seconds before a non-streaming answer starts sending keepalive whitespace")] = 60.0
    nonstream_keepalive_interval: Annotated[float, Flag("seconds between keepalive newlines of a non-streaming answer")] = 15.0
    request_timeout: Annotated[float, Flag("seconds after which a non-streaming request is aborted")] = 600.0
    drain_timeout: Annotated[float, Flag("seconds in-flight requests may finish after SIGTERM")] = 30.0
    engine_start_timeout: Annotated[float, Flag(
        "seconds the engine may take to load before the server gives up and exits 1")] = 1800.0
    engine_death_grace: Annotated[float, Flag(
        "seconds the server lingers after its engine died (new requests: 503 engine_dead; in-flight ones end with an "
        "error) before it exits 1 for its supervisor to restart it")] = 2.0
    # Size and count limits.
    max_body_bytes: Annotated[int, Flag("largest request body accepted")] = 8 * 1024 * 1024
    max_n: Annotated[int, Flag("largest 'n' accepted")] = 16
    max_concurrent_requests: Annotated[int, Flag("requests generated at once (0: no limit)")] = 0
    max_queued_requests: Annotated[int, Flag("requests that may wait for a slot")] = 0
    max_header_bytes: Annotated[int, Flag("longest request line or header field accepted (431 beyond)")] = 16384
    max_header_count: Annotated[int, Flag(
        "most header fields a request may have (431 beyond; vLLM's --h11-max-header-count)")] = 256
    # Client timeouts and the connection cap, named after nginx's directives and with its defaults (http/connection.py).
    client_header_timeout: Annotated[float, Flag(
        "seconds a client may take to send a request's headers (nginx's client_header_timeout; 408 and close, or only "
        "a close if it sent nothing; 0: no limit)")] = 60.0
    client_body_timeout: Annotated[float, Flag(
        "seconds between two reads of a request body before the request ends (nginx's client_body_timeout; 408 and "
        "close; 0: no limit)")] = 60.0
    keepalive_timeout: Annotated[float, Flag(
        "seconds an idle keep-alive connection is kept open between requests (nginx's keepalive_timeout; 0: close "
        "after each response)")] = 75.0
    max_connections: Annotated[int | None, Flag(
        "client connections open at once; past it new ones are closed at once (default: half the process's "
        "file-descriptor limit, `ulimit -n`; 0: no cap)")] = None
    # Security: which open routes need the key too; CORS (off unless origins are given).
    health_requires_api_key: Annotated[bool, Flag("/health needs the API key too")] = False
    metrics_requires_api_key: Annotated[bool, Flag("/metrics needs the API key too")] = False
    allowed_origins: Annotated[list[str], Flag(
        "CORS: origins allowed to read responses (JSON list or comma-separated; '*' any); off when empty")] = []
    allowed_methods: Annotated[list[str], Flag("CORS: allowed methods (default '*')")] = msgspec.field(
        default_factory=lambda: ["*"])
    allowed_headers: Annotated[list[str], Flag("CORS: allowed request headers (default '*')")] = msgspec.field(
        default_factory=lambda: ["*"])
    allow_credentials: Annotated[bool, Flag("CORS: allow credentials")] = False
    # Observability.
    access_log: Annotated[str, Flag("JSON access log: stdout, stderr, a file path, or off")] = "stdout"
    disable_access_log_for_endpoints: Annotated[str | None, Flag(
        "comma-separated paths (e.g. /health,/metrics) that get no access-log line")] = None
    ledger: Annotated[str | None, Flag(
        "serve: the request ledger, one record per generation request with its tokens: sqlite:///path/ledger.db or "
        "postgresql://user@host/db (off by default, also when $STREAMPROXY_LEDGER, the gateway's default, is set; read "
        "it with `streamproxy usage --ledger URL`)",
        env=None, commands=SERVE, refusal="the gateway's ledger is its config's `ledger:`")] = None
    log_error_stack: Annotated[bool, Flag(
        "log every error response with its stack trace (as vLLM's flag)", commands=SERVE)] = False
    enable_log_outputs: Annotated[bool, Flag(
        "put each request's generated text in its access-log line (`output`; as vLLM's flag)", commands=SERVE)] = False
    max_log_len: Annotated[int | None, Flag(
        "at most this many characters of a choice's text in the log (with --enable-log-outputs)", commands=SERVE)] = None
    http_log_level: Annotated[str | None, Flag("level of aiohttp's own loggers (vLLM's --uvicorn-log-level sets it too)")] = None
    # vLLM's front-end flags of the same names (streamproxy/frontend_flags.py): a path prefix, TLS and a Unix socket (http/tls.py).
    root_path: Annotated[str | None, Flag(
        "path prefix of a path-routing proxy in front (as vLLM's flag): every route also answers under it",
        commands=SERVE)] = None
    ssl_keyfile: Annotated[str | None, Flag("TLS: the private key file (as vLLM's flag)")] = None
    ssl_certfile: Annotated[str | None, Flag("TLS: the certificate (chain) file; serve HTTPS (as vLLM's flag)")] = None
    ssl_ca_certs: Annotated[str | None, Flag(
        "TLS: the CA certificates client certificates must chain to (as vLLM's flag)")] = None
    ssl_cert_reqs: Annotated[int, Flag(
        "TLS: client certificates: 0 not asked, 1 optional, 2 required (mutual TLS; as vLLM's flag)")] = 0
    ssl_ciphers: Annotated[str | None, Flag(
        "TLS: cipher suites for TLS 1.2 and below (OpenSSL cipher list; as vLLM's flag)")] = None
    enable_ssl_refresh: Annotated[bool, Flag("TLS: reload the certificate files when they change (as vLLM's flag)")] = False
    uds: Annotated[str | None, Flag("listen on this Unix socket path instead of --host/--port (as vLLM's flag)")] = None
    disable_fastapi_docs: Annotated[bool, Flag("no GET /openapi.json (vLLM's flag)", commands=SERVE)] = False
    deprecated: Annotated[list[str], Flag(
        "mark a route (/v1/completions) or field (/v1/chat/completions#max_tokens) deprecated, optionally @YYYY-MM-DD; "
        "repeatable")] = []
    deprecation_link: Annotated[str | None, Flag("URL sent as Link rel=deprecation with the Deprecation header")] = None
    # Tool calling and reasoning models (as in vLLM).
    enable_auto_tool_choice: Annotated[bool, Flag(
        "let the model call tools on its own (tool_choice auto); needs --tool-call-parser")] = False
    tool_call_parser: Annotated[str | None, Flag(
        "parser for the model's tool-call syntax: hermes, llama3_json, mistral, pythonic, any name in vLLM's "
        "tool-parser registry, or auto (read from the model's chat template)")] = None
    reasoning_parser: Annotated[str | None, Flag(
        "split the model's thinking into message.reasoning: qwen3, deepseek_r1, any name in vLLM's reasoning-parser "
        "registry, or auto (read from the model's chat template)")] = None
    reasoning_content_field: Annotated[bool, Flag(
        "also send the reasoning as `reasoning_content` (the older name LangChain, LlamaIndex and SGLang clients read); "
        "--no-reasoning-content-field sends only `reasoning`")] = True
    default_chat_template_kwargs: Annotated[dict[str, Any] | None, Flag(
        "JSON object of chat template kwargs for every request (e.g. '{\"enable_thinking\": false}'); a request's "
        "own chat_template_kwargs win")] = None
    reasoning_effort_map: Annotated[dict[str, str] | None, Flag(
        "JSON object rewriting a request's reasoning_effort to one the chat template knows, before the template sees "
        "it, on chat, Responses and Messages (e.g. '{\"medium\": \"low\", \"xhigh\": \"max\"}'; efforts not listed "
        "pass unchanged; as vLLM's flag)", commands=SERVE)] = None
    # Chat templates and answers, as vLLM's flags of the same names (streamproxy/core/chat_template.py).
    chat_template: Annotated[str | None, Flag(
        "the chat template: a file, or the template itself (as vLLM's flag); default: the model's", commands=SERVE)] = None
    chat_template_content_format: Annotated[str, Flag(
        "how message content reaches the template: string, openai (a list of parts) or auto (read from the "
        "template), as vLLM's flag", commands=SERVE)] = "auto"
    trust_request_chat_template: Annotated[bool, Flag(
        "let a request bring its own chat_template (refused with a 400 otherwise, as vLLM)", commands=SERVE)] = False
    response_role: Annotated[str, Flag("the role of the answer's message (as vLLM's flag)", commands=SERVE)] = "assistant"
    return_tokens_as_token_ids: Annotated[bool, Flag(
        "logprobs name each token 'token_id:N' (as vLLM's flag)", commands=SERVE)] = False
    enable_force_include_usage: Annotated[bool, Flag(
        "every answer carries usage, streams a usage chunk too (as vLLM's flag)", commands=SERVE)] = False
    exclude_tools_when_tool_choice_none: Annotated[bool, Flag(
        "tool_choice none: the tools are not shown to the chat template (as vLLM's flag)", commands=SERVE)] = False
    enable_server_load_tracking: Annotated[bool, Flag(
        "count requests in flight for GET /load (as vLLM's flag)", commands=SERVE)] = False
    enable_tokenizer_info_endpoint: Annotated[bool, Flag(
        "serve GET /tokenizer_info (as vLLM's flag; it shows the chat template)", commands=SERVE)] = False
    responses_store: Annotated[int, Flag(
        "keep the last N responses made with store (OpenAI's default) for GET /v1/responses/{id} (0: none, unless "
        "VLLM_ENABLE_RESPONSES_API_STORE=1, which keeps 1000, as vLLM's switch)", commands=SERVE)] = 0
    lora_modules: Annotated[list[str], Flag(
        "LoRA adapters to serve, each a model name of its own (as vLLM's flag): 'name=path' or JSON "
        "'{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'; several per flag, or the flag repeated (vLLM "
        "engine: needs --enable-lora; VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 adds POST /v1/load_lora_adapter and "
        "/v1/unload_lora_adapter)", env=None, words=True)] = []
    # The fake engine's knobs (--engine fake).
    fake_ttft: Annotated[float, Flag("fake engine: seconds before the first token")] = 0.0
    fake_token_delay: Annotated[float, Flag("fake engine: seconds between tokens")] = 0.0
    fake_text: Annotated[str, Flag("fake engine: text repeated until max_tokens")] = "Hello! This is a fake streamed answer. "
    fake_fail_after: Annotated[int | None, Flag("fake engine: fail every request after N tokens")] = None
    fake_fail_on: Annotated[str | None, Flag(
        "fake engine: --fake-fail-after applies only to requests whose prompt contains this text")] = None
    fake_crash_on: Annotated[str | None, Flag(
        "fake engine: a step serving a request whose prompt contains this text raises, and the engine dies")] = None
    fake_max_model_len: Annotated[int, Flag("fake engine: context length")] = 4096
    fake_boot_delay: Annotated[float, Flag("fake engine: seconds the engine takes to load (/health is 503 meanwhile)")] = 0.0
    admin_key: Annotated[str | None, Flag(
        "gateway: the key of the admin routes (wake and park, /v1/deployments changes, /v1/keys, the ledger's queries; "
        "none: they answer 401; the config's admin_key_env wins)")] = None
    otlp_traces_endpoint: Annotated[str | None, Flag(
        "OpenTelemetry: send a span per request to this OTLP endpoint (gRPC, or HTTP with "
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf); W3C traceparent honoured and passed on (docs/observability.md); "
        "serve passes it on to vLLM's engine too")] = None
    log_level: Annotated[str, Flag("debug, info, warning, error")] = "info"


def _declared() -> dict[str, Flag]:
    defaults = Settings()
    flags = {}
    for field in msgspec.structs.fields(Settings):
        hint, flag = typing.get_args(field.type)  # Annotated[T, Flag(...)]
        if typing.get_origin(hint) in (types.UnionType, typing.Union):  # T | None
            (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
        env = "STREAMPROXY_" + field.name.upper() if flag.env == "" else flag.env
        kind = typing.get_origin(hint) or hint
        flags[field.name] = dataclasses.replace(flag, name=field.name, kind=kind, default=getattr(defaults, field.name), env=env)
    return flags


FLAGS: dict[str, Flag] = _declared()


def add_arguments(parser: argparse.ArgumentParser, command: str = "serve") -> None:
    """Our flags, as `command` (serve or gateway) takes them. The gateway's parser has serve's own
    flags too, out of its help, so that one given is refused naming it (`serve_only_refusal`)."""
    taken = parser._option_string_actions
    for flag in FLAGS.values():
        if flag.option in taken:
            continue  # vLLM defines it (e.g. --log-level, --model): its definition wins
        env = os.environ.get(flag.env) if flag.env else None
        shown = flag.help if command in flag.commands else argparse.SUPPRESS
        parser.add_argument(flag.option, help=shown, **_reading(flag, env))


def _reading(flag: Flag, env: str | None) -> dict[str, Any]:
    """How argparse reads `flag`, with its variable's value `env` as the default when set. A list's
    default None means "not given": the Settings default applies."""
    if flag.kind is list:
        if flag.words:
            return {"nargs": "+", "action": "append" if flag.repeat else "store", "default": None}
        return {"action": "append", "type": _list_value, "default": None if env is None else [_list_value(env)]}
    if flag.kind is bool:
        return {"action": argparse.BooleanOptionalAction,
                "default": flag.default if env is None else env.strip().lower() in ("1", "true", "yes", "on")}
    kind = _json_object if flag.kind is dict else flag.kind
    return {"type": kind, "default": flag.default if env is None else kind(env)}


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _list_value(text: str) -> list[str]:
    """vLLM's form (a JSON list, e.g. '["https://a.example"]') or comma-separated."""
    text = text.strip()
    if text.startswith("["):
        return [str(v) for v in json.loads(text)]
    return [part.strip() for part in text.split(",") if part.strip()]


def settings_from_namespace(ns: argparse.Namespace) -> Settings:
    values: dict[str, Any] = {}
    for name, flag in FLAGS.items():
        value: Any = getattr(ns, name, None)
        if not hasattr(ns, name) or (flag.kind is list and value is None):
            continue  # (a list not given: the Settings default)
        values[name] = [item for group in value for item in group] if flag.kind is list and flag.repeat else value
    keys = [key for value in values.pop("api_key", []) for key in _read_key(value)]
    keys += [os.environ[env] for env in ("STREAMPROXY_API_KEY", "VLLM_API_KEY") if os.environ.get(env)]
    return Settings(api_key=keys, **values)


def serve_only_refusal(settings: Settings) -> str | None:
    """The gateway: why a flag of serve's own that `settings` set stops it (None: none is set)."""
    for flag in FLAGS.values():
        if "gateway" not in flag.commands and getattr(settings, flag.name) != flag.default:
            return f"{flag.option} is a flag of streamproxy serve; {flag.refusal}"
    return None


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
    """A config file's keys as command-line flags (`key: value` -> `--key value`; a list repeats a
    repeatable flag of ours, else it is one flag's words, as for vLLM's)."""
    flags: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        ours = FLAGS.get(str(key).replace("-", "_"))
        if value is True:
            flags.append(flag)
        elif value is False and ours is not None and ours.kind is bool:
            flags.append("--no-" + flag[2:])  # as vllm serve's --config: `x: false` turns a flag that is on by default off
        elif value is False or value is None:
            continue
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]  # e.g. default_chat_template_kwargs
        elif isinstance(value, list) and ours is not None and ours.kind is list and ours.repeat:
            for v in value:
                flags += [flag, str(v)]
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags
