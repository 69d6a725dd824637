"""The layers' import rules (ARCHITECTURE.md), read from the source with `ast`.

Every import counts, also one inside a function: a lazy `import vllm` in the
core would still tie the core to the engine.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SANS_IO = ("streamproxy/core", "streamproxy/apis", "streamproxy/protocol", "streamproxy/filters")
ENGINES = ("vllm", "torch", "transformers")
IO = ("aiohttp", "asyncio", "socket", "ctypes", "streamproxy.oscalls", "streamproxy.http", "streamproxy.cli", "streamproxy.gateway")


def imports(path: Path, source: str | None = None) -> set[str]:
    """Absolute names of every module `path` imports (relative ones resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                found.add(".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else [])))
            else:
                found.add(node.module or "")
    return found


def modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def offending(path: Path, prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in imports(path) if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_the_rule_reader_sees_lazy_and_relative_imports() -> None:
    where = ROOT / "streamproxy" / "core" / "example.py"
    source = "def f():\n    import vllm.sampling_params\n    from ..http import writer\n    from .sse import encode\n"
    assert imports(where, source) == {"vllm.sampling_params", "streamproxy.http", "streamproxy.core.sse"}


@pytest.mark.parametrize("path", modules(*SANS_IO), ids=lambda p: str(p.relative_to(ROOT)))
def test_sans_io_layers_import_no_io_and_no_engine(path: Path) -> None:
    assert offending(path, IO + ENGINES) == []


@pytest.mark.parametrize("path", modules("streamproxy"), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_engine_adapter_imports_the_engine(path: Path) -> None:
    assert offending(path, ENGINES) == []
    # The server reaches an engine through the protocol (`engine_adapter.base`: Engine, OutputStream and
    # their value types); the CLI alone picks one to build. An engine's parsers join the filters'
    # registry from the adapter's side (filters/registry.py): the filters never reach into an adapter.
    if path.relative_to(ROOT).as_posix() != "streamproxy/cli.py":
        assert set(offending(path, ("engine_adapter",))) <= {"engine_adapter.base"}


@pytest.mark.parametrize("path", modules("streamproxy/filters"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_filters_import_no_engine_adapter(path: Path) -> None:
    # engine_adapter implements the filter protocol (vLLM's parsers) and imports the filters: no way back.
    assert offending(path, ("engine_adapter",)) == []


@pytest.mark.parametrize("path", modules("streamproxy", "engine_adapter"), ids=lambda p: str(p.relative_to(ROOT)))
def test_os_calls_are_one_modules(path: Path) -> None:
    # prctl and its kin: streamproxy/oscalls.py alone, outside the sans-IO layers.
    if path.relative_to(ROOT).as_posix() != "streamproxy/oscalls.py":
        assert offending(path, ("ctypes",)) == []


@pytest.mark.parametrize("path", modules("bench"), ids=lambda p: str(p.relative_to(ROOT)))
def test_bench_imports_nothing_from_the_tests(path: Path) -> None:
    # What both need is in harness/. tests/conftest.py sets STREAMPROXY_LEDGER and an atexit hook on import:
    # a benchmark would inherit both.
    assert offending(path, ("tests",)) == []


@pytest.mark.parametrize("path", modules("harness"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_harness_imports_neither_the_tests_nor_bench(path: Path) -> None:
    assert offending(path, ("tests", "bench", "pytest")) == []


@pytest.mark.parametrize("path", modules("engine_adapter"), ids=lambda p: str(p.relative_to(ROOT)))
def test_engine_adapter_does_not_import_the_edge(path: Path) -> None:
    assert offending(path, ("aiohttp", "streamproxy.http", "streamproxy.cli", "streamproxy.gateway")) == []


@pytest.mark.parametrize("path", modules("streamproxy/ledger"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_ledger_imports_neither_the_edge_nor_the_gateway(path: Path) -> None:
    # The gateway (and serve) use the ledger; it knows nothing of them, of HTTP or of an engine.
    assert offending(path, ("aiohttp", "streamproxy.http", "streamproxy.gateway", "streamproxy.cli", "engine_adapter")) == []


@pytest.mark.parametrize("path", modules("streamproxy"), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_postgresql_store_imports_psycopg(path: Path) -> None:
    # A gateway on SQLite never loads the PostgreSQL driver.
    if path.relative_to(ROOT).as_posix() != "streamproxy/ledger/postgres.py":
        assert offending(path, ("psycopg",)) == []


@pytest.mark.parametrize("name", ["records", "params", "schema", "sql"])
def test_the_ledgers_sans_io_modules_do_no_io(name: str) -> None:
    assert offending(ROOT / "streamproxy" / "ledger" / f"{name}.py", IO + ENGINES + ("sqlite3", "psycopg", "threading")) == []
