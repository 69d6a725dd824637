"""`streamproxy serve|gateway|usage ...`: parse flags, build the engine (or the gateway's config), run the server.

Our own flags are declared on `config.Settings`' fields. With `--engine vllm` (the
default) `engine_adapter.vllm_cli` adds vLLM's own engine flags and builds
the engine; vLLM is imported only on that path, so `--engine fake` starts
in well under a second. This is the one module of `streamproxy` that picks
an engine implementation.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from streamproxy.gateway.config import GatewayConfig

from streamproxy.config import Settings, add_arguments, expand_config_file, mapping_to_flags, serve_only_refusal, settings_from_namespace

if TYPE_CHECKING:
    from engine_adapter.base import Engine


def _fake_engine(settings: Settings) -> Engine:
    from engine_adapter.fake import FakeEngine, FakeScript

    script = FakeScript(
        text=settings.fake_text,
        ttft=settings.fake_ttft,
        token_delay=settings.fake_token_delay,
        fail_after=settings.fake_fail_after,
        fail_on=settings.fake_fail_on,
        crash_on=settings.fake_crash_on,
    )
    return FakeEngine(
        script, served_names=settings.served_model_name or ["fake"], max_model_len=settings.fake_max_model_len, record=False,
        load_delay=settings.fake_boot_delay,
    )


def parse(argv: list[str]) -> tuple[Settings, argparse.Namespace]:
    """`streamproxy serve`'s flags as settings (and the namespace the engine is built from), checked
    as far as they can be before an engine exists. With vLLM, `vllm serve`'s front-end flags too:
    refused or mapped onto ours (frontend_flags.py)."""
    argv = expand_config_file(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--engine", default=Settings().engine)
    known, _ = pre.parse_known_args(argv)
    if known.engine == "fake":
        parser = argparse.ArgumentParser(prog="streamproxy serve")
        add_arguments(parser)
        ns = parser.parse_args(argv)
        settings = settings_from_namespace(ns)
        vllm, lora_enabled = False, True
    elif known.engine == "vllm":
        from engine_adapter import vllm_cli
        from streamproxy import frontend_flags

        ns = vllm_cli.parser(add_arguments).parse_args(argv)
        settings = settings_from_namespace(ns)
        frontend_flags.apply(ns, vllm_cli.frontend_defaults(ns), settings)
        vllm_cli.import_tool_parser_plugin(ns.tool_parser_plugin)
        settings.chat_template = vllm_cli.load_chat_template(settings.chat_template)
        vllm, lora_enabled = True, bool(ns.enable_lora)
    else:
        raise SystemExit(f"unknown --engine {known.engine!r}: expected vllm or fake")
    _check_parsers(settings, vllm_parsers=vllm)
    _check_lora_modules(settings, lora_enabled=lora_enabled)
    _check_front_end(settings)
    return settings, ns


def build(argv: list[str], client: tuple[int, int, Any] | None = None) -> tuple[Settings, Engine]:
    """Settings and engine from the command line; `client` (index, count, vLLM client config or None):
    this process is one of `count` API servers (workers.py)."""
    settings, ns = parse(argv)
    if settings.engine == "fake":
        return settings, _fake_engine(settings)
    from engine_adapter import vllm_cli

    shared = client if client is not None and client[2] is not None else None
    engine = vllm_cli.engine(ns, direct_outputs=settings.direct_outputs, client=shared)
    settings.model, settings.served_model_name = ns.model, ns.served_model_name
    return settings, engine


def _check_front_end(settings: Settings) -> None:
    """What the front end's flags need checked before an engine loads: values with a fixed set of
    choices, the chat template read now (a file or the template itself), the TLS files, --uds, --root-path."""
    from streamproxy.core.chat_template import CONTENT_FORMATS, load

    if settings.chat_template_content_format not in CONTENT_FORMATS:
        raise SystemExit(f"--chat-template-content-format must be one of {', '.join(CONTENT_FORMATS)}")
    _check_effort_map(settings.reasoning_effort_map)
    if settings.chat_template is not None:
        try:
            settings.chat_template = load(settings.chat_template)
        except ValueError as exc:
            raise SystemExit(f"--chat-template: {exc}") from None
    from streamproxy.http.tls import TLSError, server_context

    try:
        server_context(settings)  # the files read now: a bad one stops the start before the engine loads
    except TLSError as exc:
        raise SystemExit(str(exc)) from None
    if settings.uds and settings.api_server_count != 1:
        raise SystemExit("--uds with --api-server-count above 1 is not supported (the workers share a TCP port)")
    if settings.root_path:
        settings.root_path = "/" + settings.root_path.strip("/")
        if settings.root_path == "/":
            settings.root_path = None


def _check_effort_map(effort_map: dict[str, Any] | None) -> None:
    """--reasoning-effort-map: keys are efforts, values strings (as vLLM's validate_reasoning_effort_map)."""
    from streamproxy.core.params import REASONING_EFFORTS

    if effort_map is None:
        return
    if not all(isinstance(v, str) for v in effort_map.values()):
        raise SystemExit("--reasoning-effort-map must be a JSON object mapping reasoning efforts to strings")
    unknown = sorted(set(effort_map) - set(REASONING_EFFORTS))
    if unknown:
        raise SystemExit(f"--reasoning-effort-map has unknown efforts {unknown}; keys must be one of {list(REASONING_EFFORTS)}")


def _check_parsers(settings: Settings, *, vllm_parsers: bool) -> None:
    """--enable-auto-tool-choice needs a --tool-call-parser; both parser flags must name one that exists
    (as vLLM checks at start)."""
    from streamproxy.filters.chain import OWN_PARSERS, OWN_REASONING, known_parser, known_reasoning_parser

    if settings.enable_auto_tool_choice and not settings.tool_call_parser:
        raise SystemExit("--enable-auto-tool-choice requires --tool-call-parser NAME")
    vllm = "; or a name in vLLM's registry" if vllm_parsers else ""
    for flag, name, known, ours in (("--tool-call-parser", settings.tool_call_parser, known_parser, OWN_PARSERS),
                                    ("--reasoning-parser", settings.reasoning_parser, known_reasoning_parser, OWN_REASONING)):
        if name and not known(name):
            raise SystemExit(f"unknown {flag} {name!r} (ours: {', '.join(sorted(ours))}{vllm})")


def _check_lora_modules(settings: Settings, *, lora_enabled: bool) -> None:
    """--lora-modules reads (both of vLLM's forms), before the engine loads for minutes."""
    from streamproxy.core.adapters import parse_lora_modules

    try:
        modules = parse_lora_modules(settings.lora_modules)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if modules and not lora_enabled:
        raise SystemExit("--lora-modules needs --enable-lora (the engine loads adapters only with it)")


def build_gateway(argv: list[str]) -> tuple[Settings, GatewayConfig]:
    """`streamproxy gateway --config FILE.yaml [flags]`: the deployments from the file, and the
    edge's flags from the file's other keys, the environment and the command line."""
    from streamproxy.gateway.config import ConfigError

    if "--config" not in argv or argv.index("--config") + 1 >= len(argv):
        raise SystemExit("streamproxy gateway needs --config FILE.yaml (see configs/gateway.yaml)")
    at = argv.index("--config")
    path = argv[at + 1]
    try:
        return load_gateway(path, argv[:at] + argv[at + 2 :])
    except ConfigFileError as exc:
        _config_error(path, str(exc))
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None


class ConfigFileError(ValueError):
    """The file itself cannot be read or fails the gateway config's checks."""


def load_gateway(path: str, flags: list[str], *, strict: bool = False) -> tuple[Settings, GatewayConfig]:
    """The gateway's settings and config from the file at `path` and the command line's other `flags`:
    `ConfigFileError` for the file, `ConfigError` for the rest; `strict` (a reload): a flag argparse
    refuses is a `ConfigError` too, where at start it is argparse's usage message and exit 2."""
    from streamproxy.gateway.config import ConfigError
    from streamproxy.gateway.config_file import split

    try:
        config, from_file = split(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigFileError(exc.strerror or str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"not UTF-8 text (byte {exc.start})") from None
    except ConfigError as exc:
        raise ConfigFileError(str(exc)) from None
    from streamproxy.gateway.upstream_tls import contexts

    try:  # CA bundles and client certificates for https:// replicas: read now, so a bad one stops the start (or a reload)
        contexts(config)
    except ConfigError as exc:
        raise ConfigFileError(str(exc)) from None
    parser = _StrictParser(prog="streamproxy gateway") if strict else argparse.ArgumentParser(prog="streamproxy gateway")
    add_arguments(parser, "gateway")
    ns = parser.parse_args(mapping_to_flags(from_file) + flags)
    try:
        settings = settings_from_namespace(ns)
    except (OSError, ValueError) as exc:  # an `--api-key @file` that cannot be read
        raise ConfigError(f"--api-key: {exc}") from None
    refusal = serve_only_refusal(settings)
    if refusal is not None:
        raise ConfigError(refusal)
    from streamproxy.http.tls import TLSError, server_context

    try:  # the gateway listens through the same runner: TLS and --uds work there too
        server_context(settings)
    except TLSError as exc:
        raise ConfigError(str(exc)) from None
    return settings, config


class _StrictParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        from streamproxy.gateway.config import ConfigError

        raise ConfigError(f"a server flag: {message}")


def _config_error(path: str, message: str) -> NoReturn:
    """A config file that cannot be used: one line on stderr naming it, and exit 2 (as argparse does for bad flags)."""
    print(f"streamproxy gateway: {path}: {message}", file=sys.stderr)
    raise SystemExit(2)


USAGE = """usage: streamproxy serve [--engine vllm|fake] [--host H] [--port P] [vLLM engine flags]
       streamproxy gateway --config FILE.yaml [--host H] [--port P] [flags]
       streamproxy usage [--since 7d] [--by key] [--ledger URL | --config FILE.yaml]   the ledger's sums
       streamproxy serve --help | streamproxy gateway --help   for every flag"""


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, rest = args[0], args[1:]
    if command == "usage":
        from streamproxy.ledger.usage_cli import main as usage_main

        raise SystemExit(usage_main(rest))
    if command not in ("serve", "gateway"):
        raise SystemExit(f"unknown command {command!r}\n{USAGE}")
    # Logging first (INFO), so start-up decisions (default model, KV cache) are seen;
    # the level from the flags applies once they are parsed.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if command == "gateway":
        if rest and rest[0] in ("-h", "--help"):
            argparse_help = argparse.ArgumentParser(prog="streamproxy gateway --config FILE.yaml")
            add_arguments(argparse_help, "gateway")
            argparse_help.print_help()
            return
        settings, config = build_gateway(rest)
        logging.getLogger().setLevel(settings.log_level.upper())
        _http_log_level(settings)
        from streamproxy.gateway.app import run_gateway

        at = rest.index("--config")
        path = rest[at + 1]
        run_gateway(settings, config, reload=partial(load_gateway, path, rest[:at] + rest[at + 2 :], strict=True), source=path)
        return
    settings, engine = build(rest)
    logging.getLogger().setLevel(settings.log_level.upper())
    _http_log_level(settings)
    if settings.ledger is not None:
        _check_ledger(settings)
    if settings.api_server_count != 1:
        code = serve_workers(settings, engine, rest)
        if code:
            raise SystemExit(code)
        return
    from streamproxy.http.server import run

    run(settings, engine)


def _http_log_level(settings: Settings) -> None:
    """vLLM's --uvicorn-log-level: aiohttp's loggers here ("trace" is DEBUG)."""
    if settings.http_log_level:
        level = settings.http_log_level.upper()
        logging.getLogger("aiohttp").setLevel("DEBUG" if level == "TRACE" else level)


def _check_ledger(settings: Settings) -> None:
    """--ledger opened (and migrated) once here, before the engine loads and the workers start:
    a store that cannot be opened stops the start with one line naming --ledger."""
    import asyncio

    from streamproxy.ledger.writer import open_ledger

    async def check() -> None:
        ledger = await open_ledger(settings.ledger, "--ledger")
        if ledger is not None:
            await ledger.store.close()

    asyncio.run(check())


def serve_workers(settings: Settings, engine: Engine, argv: list[str]) -> int:
    """`--api-server-count N`: this process supervises N API servers (workers.py); with vLLM it
    starts the engine core(s) they share (engine_adapter/vllm_shared.py), else each has its own engine."""
    from streamproxy.workers import EngineHost, NoSharedEngine, run_workers

    host: EngineHost = NoSharedEngine()
    if settings.engine == "vllm":
        from engine_adapter.vllm_engine import VllmEngine
        from engine_adapter.vllm_shared import SharedCores

        assert isinstance(engine, VllmEngine)
        host = SharedCores(engine.engine_args)
    return run_workers(settings, argv, run_worker, host)


def run_worker(index: int, count: int, argv: list[str], sock: socket.socket, client: Any) -> None:
    """One API server of `count` (a spawned process): the port's socket `sock` from the parent, and
    with vLLM the client config of the engine cores the parent started."""
    from streamproxy.workers import become_worker, worker_settings

    become_worker()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s [api{index}] %(name)s: %(message)s")
    settings, engine = build(argv, (index, count, client))
    logging.getLogger().setLevel(settings.log_level.upper())
    from streamproxy.http.server import run

    run(worker_settings(settings, index, count), engine, sock=sock)


if __name__ == "__main__":
    main()
