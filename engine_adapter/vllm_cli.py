"""`streamproxy serve --engine vllm`: vLLM's own engine flags and the engine they build.

The parser takes every engine flag of `vllm serve`, added by vLLM's own
`AsyncEngineArgs.add_cli_args` (not copied), so `--max-model-len`,
`--tensor-parallel-size`, ... mean what they mean there. With no `--model`
the default model is prepared from its PyPI package and served under a
stable name. Only the CLI imports this module, and only on the vllm path.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from functools import cache
from typing import Any

from engine_adapter import vllm_compat, vllm_parsers
from engine_adapter.vllm_engine import VllmEngine

log = logging.getLogger("streamproxy.engine.vllm")

# KV cache for CPU engines when none is configured. Without it vLLM's CPU
# worker reserves --gpu-memory-utilization (0.92) of the machine's memory and
# refuses to start when anything else holds more than 8% of it.
DEFAULT_CPU_KV_CACHE_GIB = 4


def parser(add_own_flags: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    """vLLM's engine flags, the server's own (added by `add_own_flags`), then every other front-end
    flag of `vllm serve` as vLLM's own parser defines it (what each means here: streamproxy/frontend_flags.py).
    A vLLM whose parser cannot be built so stops the start with one line naming its release."""
    vllm_parsers.add()  # before the flags naming a parser are checked
    try:
        return _parser(add_own_flags)
    except (ImportError, AttributeError, TypeError) as exc:
        raise SystemExit(f"vLLM {vllm_compat.release()} does not fit streamproxy's use of its flags "
                         f"({type(exc).__name__}: {exc}); supported releases: {', '.join(vllm_compat.SUPPORTED)}") from None


def _parser(add_own_flags: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    p = FlexibleArgumentParser(prog="streamproxy serve", description="OpenAI-compatible server, vLLM in-process")
    p.add_argument("model_tag", nargs="?", default=None, help="model folder or hub id (same as --model)")
    AsyncEngineArgs.add_cli_args(p)
    add_own_flags(p)
    group = p.add_argument_group("vLLM front end", "vllm serve's other front-end flags (see docs/flags-and-routes.md)")
    taken = p._option_string_actions
    for action, strings in _frontend_options():
        ours = next((taken[o] for o in strings if o in taken), None)
        if ours is None:
            group._add_action(action)
        for other in strings:  # the aliases vLLM keeps out of help (vllm_compat.option_strings), and on a
            taken.setdefault(other, ours or action)  # flag we define, vLLM's other spellings (-asc)
    p.set_defaults(model=None)
    return p


@cache
def _frontend_options() -> tuple[tuple[argparse.Action, tuple[str, ...]], ...]:
    """The options of `vllm serve`'s parser (vLLM's `make_arg_parser`) that are not engine flags:
    the front end's, with vLLM's own types, defaults and choices, and every string that selects each."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    engine_options = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser(add_help=False))._option_string_actions
    serve = vllm_compat.cli_args().make_arg_parser(FlexibleArgumentParser(add_help=False))
    return tuple((a, tuple(strings)) for a, strings in vllm_compat.option_strings(serve)
                 if not any(o in engine_options for o in strings))


def frontend_actions() -> tuple[argparse.Action, ...]:
    return tuple(a for a, _ in _frontend_options())


def frontend_defaults(ns: argparse.Namespace) -> dict[str, Any]:
    """vLLM's default of each front-end flag the parsed namespace has."""
    return {a.dest: a.default for a in frontend_actions() if hasattr(ns, a.dest)}


def load_chat_template(value: str | None) -> str | None:
    """--chat-template as vLLM reads it: a file, the template itself, or the name of one of vLLM's
    own templates (vllm/transformers_utils/chat_templates)."""
    if value is None:
        return None
    from vllm.renderers.chat_utils import load_chat_template as vllm_load

    try:
        return vllm_load(value)
    except Exception as exc:
        raise SystemExit(f"--chat-template: {exc}") from None


def import_tool_parser_plugin(path: str) -> None:
    """--tool-parser-plugin: the file registers its parsers in vLLM's registry (as vllm serve does at start)."""
    if not path:
        return
    from vllm.tool_parsers import ToolParserManager

    try:
        ToolParserManager.import_tool_parser(path)
    except Exception as exc:
        raise SystemExit(f"--tool-parser-plugin {path!r} could not be imported: {exc}") from None


def engine(ns: argparse.Namespace, *, direct_outputs: bool, client: tuple[int, int, Any] | None = None) -> VllmEngine:
    """The engine the parsed flags describe; `ns.model` and `ns.served_model_name` are filled in.
    `client`: (index, count, client config) of an API server sharing engine cores (vllm_shared.py)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from engine_adapter.default_model import DEFAULT_MODEL_NAME, ensure_default_model

    warning = vllm_compat.release_warning()
    if warning is not None and client is None:  # (API servers of --api-server-count: their parent said it)
        log.warning(warning)
    if ns.reasoning_parser == "auto":
        # Chosen from the chat template once the model has loaded (streamproxy.filters.detect): the
        # engine, started before that, does not get it, so structured outputs do not wait for the
        # thinking to end. Name the parser to have them wait.
        ns.reasoning_parser = ""
    elif ns.reasoning_parser:
        # vLLM's own flag: the engine gets the bare name too (structured outputs wait for the thinking to end).
        ns.reasoning_parser = ns.reasoning_parser.removeprefix("vllm:")
    model = ns.model_tag or ns.model
    if model is None:
        model = str(ensure_default_model(progress=True))
        if not ns.served_model_name:
            ns.served_model_name = [DEFAULT_MODEL_NAME]
        _default_model_dtype(ns)
    ns.model = model
    ns.served_model_name = ns.served_model_name or [model]
    _default_cpu_kv_cache(ns)
    engine_args = AsyncEngineArgs.from_cli_args(ns)
    # --no-enable-flash-late-interaction (0.33: --disable-...), as vllm serve
    vllm_compat.cli_args().propagate_flash_late_interaction(ns, engine_args)
    return VllmEngine(engine_args, ns.served_model_name, root=model, direct_outputs=direct_outputs, client=client)


def _default_cpu_kv_cache(ns: argparse.Namespace) -> None:
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE") or getattr(ns, "kv_cache_memory_bytes", None):
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(DEFAULT_CPU_KV_CACHE_GIB)
        log.info("CPU engine: KV cache %d GiB (set VLLM_CPU_KVCACHE_SPACE or --kv-cache-memory-bytes to change)", DEFAULT_CPU_KV_CACHE_GIB)


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """The CPU computes bfloat16 natively (AVX512-BF16 or AMX); unknown (no /proc/cpuinfo) counts as yes."""
    try:
        with open(cpuinfo) as f:
            text = f.read()
    except OSError:
        return True
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    return flags is None or "avx512_bf16" in flags or "amx_bf16" in flags


def _default_model_dtype(ns: argparse.Namespace) -> None:
    """The default model (bfloat16 weights) in float32 on a CPU engine that would emulate bfloat16, unless
    --dtype says otherwise: several times faster in a batch there, and 135M parameters fit either way."""
    if getattr(ns, "dtype", "auto") != "auto":
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and not cpu_has_native_bf16():
        ns.dtype = "float32"
        log.info("CPU engine without native bfloat16: the default model in float32 (--dtype to change)")
