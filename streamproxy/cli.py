"""`streamproxy serve ...`: parse flags, build the engine, run the server.

Our own flags come from `config.Settings`. With `--engine vllm` (the
default) the parser also takes every engine flag of `vllm serve`, added by
vLLM's own `AsyncEngineArgs.add_cli_args` (not copied), so `--max-model-len`,
`--tensor-parallel-size`, `--distributed-executor-backend`, ... mean what
they mean there. With no `--model`, the default model is prepared from its
PyPI package and served under a stable name. vLLM is imported only on that
path: `--engine fake` starts in well under a second.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from .config import Settings, add_arguments, expand_config_file, settings_from_namespace


def _fake_engine(settings: Settings) -> Any:
    from engine_adapter.fake import FakeEngine, FakeScript

    script = FakeScript(
        text=settings.fake_text,
        ttft=settings.fake_ttft,
        token_delay=settings.fake_token_delay,
        fail_after=settings.fake_fail_after,
    )
    return FakeEngine(
        script, served_names=settings.served_model_name or ["fake"], max_model_len=settings.fake_max_model_len, record=False
    )


def _vllm_parser() -> argparse.ArgumentParser:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="streamproxy serve", description="OpenAI-compatible server, vLLM in-process")
    parser.add_argument("model_tag", nargs="?", default=None, help="model folder or hub id (same as --model)")
    AsyncEngineArgs.add_cli_args(parser)
    add_arguments(parser, with_model_flags=False)
    parser.set_defaults(model=None)
    return parser


def _vllm_engine(ns: argparse.Namespace, settings: Settings) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs

    from engine_adapter.vllm_engine import VllmEngine

    from .default_model import DEFAULT_MODEL_NAME, ensure_default_model

    model = ns.model_tag or ns.model
    if model is None:
        model = str(ensure_default_model(progress=True))
        if not ns.served_model_name:
            ns.served_model_name = [DEFAULT_MODEL_NAME]
    ns.model = model
    _default_cpu_kv_cache(ns)
    engine_args = AsyncEngineArgs.from_cli_args(ns)
    names = ns.served_model_name or [model]
    settings.model = model
    settings.served_model_name = names
    return VllmEngine(engine_args, names, root=model, direct_outputs=settings.direct_outputs)


# KV cache for CPU engines when none is configured. Without it vLLM's CPU
# worker reserves --gpu-memory-utilization (0.92) of the machine's memory and
# refuses to start when anything else holds more than 8% of it.
DEFAULT_CPU_KV_CACHE_GIB = 4


def _default_cpu_kv_cache(ns: argparse.Namespace) -> None:
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE") or getattr(ns, "kv_cache_memory_bytes", None):
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(DEFAULT_CPU_KV_CACHE_GIB)
        logging.getLogger("streamproxy.cli").info(
            "CPU engine: KV cache %d GiB (set VLLM_CPU_KVCACHE_SPACE or --kv-cache-memory-bytes to change)",
            DEFAULT_CPU_KV_CACHE_GIB,
        )


def build(argv: list[str]) -> tuple[Settings, Any]:
    argv = expand_config_file(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--engine", default=Settings().engine)
    known, _ = pre.parse_known_args(argv)
    if known.engine == "fake":
        parser = argparse.ArgumentParser(prog="streamproxy serve")
        add_arguments(parser, with_model_flags=True)
        ns = parser.parse_args(argv)
        settings = settings_from_namespace(ns)
        _check_tool_flags(settings, vllm_parsers=False)
        _check_reasoning_flag(settings, vllm_parsers=False)
        return settings, _fake_engine(settings)
    if known.engine != "vllm":
        raise SystemExit(f"unknown --engine {known.engine!r}: expected vllm or fake")
    ns = _vllm_parser().parse_args(argv)
    settings = settings_from_namespace(ns)
    _check_tool_flags(settings, vllm_parsers=True)
    _check_reasoning_flag(settings, vllm_parsers=True)
    if ns.reasoning_parser:
        # vLLM's own flag: the engine gets the bare name too (structured outputs wait for the thinking to end).
        ns.reasoning_parser = ns.reasoning_parser.removeprefix("vllm:")
    return settings, _vllm_engine(ns, settings)


def _check_tool_flags(settings: Settings, *, vllm_parsers: bool) -> None:
    """--enable-auto-tool-choice needs a --tool-call-parser that exists (as vLLM checks at start)."""
    from .filters.chain import OWN_PARSERS, known_parser

    name = settings.tool_call_parser
    if settings.enable_auto_tool_choice and not name:
        raise SystemExit("--enable-auto-tool-choice requires --tool-call-parser NAME")
    if name and not known_parser(name, vllm_available=vllm_parsers):
        where = "ours: " + ", ".join(sorted(OWN_PARSERS)) + ("; or a name in vLLM's registry" if vllm_parsers else "")
        raise SystemExit(f"unknown --tool-call-parser {name!r} ({where})")


def _check_reasoning_flag(settings: Settings, *, vllm_parsers: bool) -> None:
    from .filters.chain import OWN_REASONING, known_reasoning_parser

    name = settings.reasoning_parser
    if name and not known_reasoning_parser(name, vllm_available=vllm_parsers):
        where = "ours: " + ", ".join(sorted(OWN_REASONING)) + ("; or a name in vLLM's registry" if vllm_parsers else "")
        raise SystemExit(f"unknown --reasoning-parser {name!r} ({where})")


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: streamproxy serve [--engine vllm|fake] [--host H] [--port P] [vLLM engine flags]\n"
              "       streamproxy serve --help   for every flag")
        return
    command, rest = args[0], args[1:]
    if command != "serve":
        raise SystemExit(f"unknown command {command!r}; try 'streamproxy serve --help'")
    # Logging first (INFO), so start-up decisions (default model, KV cache) are seen;
    # the level from the flags applies once they are parsed.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings, engine = build(rest)
    logging.getLogger().setLevel(settings.log_level.upper())
    from .server import run

    run(settings, engine)


if __name__ == "__main__":
    main()
