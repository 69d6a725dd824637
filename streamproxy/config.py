"""Typed front-end settings, layered: configs/*.yaml < STREAMPROXY_* env < CLI flags.

`Settings` is a msgspec Struct, one field per flag of ours; each field's flag
is `--field-name` and its env var `STREAMPROXY_FIELD_NAME`. The YAML file
(`--config`) may also carry vLLM engine flags: every key is turned into
`--key value` and put before the command line's own arguments, so a flag on
the command line always wins (the way `vllm serve --config` behaves).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import msgspec


class Settings(msgspec.Struct, kw_only=True):
    host: str = "0.0.0.0"
    port: int = 8000
    engine: str = "vllm"  # "vllm" or "fake"
    model: str | None = None
    served_model_name: list[str] | None = None
    api_key: list[str] = []
    # Streaming keepalive and bounds (seconds).
    sse_heartbeat: float = 15.0
    write_stall_timeout: float = 30.0
    nonstream_keepalive_after: float = 60.0
    nonstream_keepalive_interval: float = 15.0
    request_timeout: float = 600.0
    drain_timeout: float = 30.0
    # Size and count limits.
    max_body_bytes: int = 8 * 1024 * 1024
    max_n: int = 16
    max_concurrent_requests: int = 0  # 0: unlimited
    max_queued_requests: int = 0
    # Fake engine knobs (--engine fake).
    fake_ttft: float = 0.0
    fake_token_delay: float = 0.0
    fake_text: str = "Hello! This is a fake streamed answer. "
    fake_fail_after: int | None = None
    fake_max_model_len: int = 4096
    log_level: str = "info"


# Flags of ours and how argparse reads them (type, action, help).
_FLAG_HELP: dict[str, str] = {
    "host": "address to listen on",
    "port": "port to listen on",
    "engine": "vllm (embedded vLLM AsyncLLM) or fake (scripted, for tests/benchmarks)",
    "api_key": "API key clients must send as 'Authorization: Bearer'; repeatable (env STREAMPROXY_API_KEY, or @file)",
    "sse_heartbeat": "seconds of silence on a stream before an SSE keepalive comment",
    "write_stall_timeout": "seconds a stream may wait on a client that does not read before it is ended",
    "nonstream_keepalive_after": "seconds before a non-streaming answer starts sending keepalive whitespace",
    "nonstream_keepalive_interval": "seconds between keepalive newlines of a non-streaming answer",
    "request_timeout": "seconds after which a non-streaming request is aborted",
    "drain_timeout": "seconds in-flight requests may finish after SIGTERM",
    "max_body_bytes": "largest request body accepted",
    "max_n": "largest 'n' accepted",
    "max_concurrent_requests": "requests generated at once (0: no limit)",
    "max_queued_requests": "requests that may wait for a slot",
    "fake_ttft": "fake engine: seconds before the first token",
    "fake_token_delay": "fake engine: seconds between tokens",
    "fake_text": "fake engine: text repeated until max_tokens",
    "fake_fail_after": "fake engine: fail every request after N tokens",
    "fake_max_model_len": "fake engine: context length",
    "log_level": "debug, info, warning, error",
}


def add_arguments(parser: argparse.ArgumentParser, *, with_model_flags: bool) -> None:
    """Add our flags; `--model`/`--served-model-name` only when vLLM's args are absent."""
    defaults = Settings()
    taken = getattr(parser, "_option_string_actions", {})
    for name, help_text in _FLAG_HELP.items():
        default = getattr(defaults, name)
        flag = "--" + name.replace("_", "-")
        if flag in taken:
            continue  # vLLM defines it (e.g. --log-level): its definition wins
        env_default = os.environ.get("STREAMPROXY_" + name.upper())
        if name == "api_key":
            parser.add_argument(flag, action="append", default=None, help=help_text)
            continue
        kind: Any = type(default) if default is not None else int
        if env_default is not None:
            default = kind(env_default)
        parser.add_argument(flag, type=kind, default=default, help=help_text)
    if with_model_flags:
        parser.add_argument("--model", default=None, help="model folder or hub id")
        parser.add_argument("--served-model-name", nargs="+", default=None, help="name(s) the model is served under")


def settings_from_namespace(ns: argparse.Namespace) -> Settings:
    values = {f: getattr(ns, f) for f in Settings.__struct_fields__ if hasattr(ns, f)}
    keys: list[str] = []
    for key in values.pop("api_key", None) or []:
        keys.extend(_read_key(key))
    env_key = os.environ.get("STREAMPROXY_API_KEY")
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
    flags: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            if key in ("api_key", "api-key"):
                for v in value:
                    flags += [flag, str(v)]
            else:
                flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    # Subcommand (e.g. "serve") stays first.
    head = rest[:1] if rest and not rest[0].startswith("-") else []
    return head + flags + rest[len(head) :]
