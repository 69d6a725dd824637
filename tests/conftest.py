"""Shared fixtures: one real vLLM engine for the whole test session, and the push spy.

The server runs as a subprocess (`python -m streamproxy serve`, default model,
`-O0` so it starts in ~20 s instead of ~60 s): vLLM spawns its engine core,
which must not re-import pytest's main module, and a real process also tests
the CLI and start-up path. Tests talk to it over HTTP on loopback.

It lives here (not in tests/engine/) because tests/engine and tests/compat
both use it, and a session fixture defined once is started once: every test
marked `engine` in any folder shares the same server.

`vllm_server` is vLLM's own OpenAI server on the same model with the same engine
flags, the reference to compare streamproxy's answers with on this machine (also
started once, and only when a test asks for it).

Each is launched ahead of its first test, while earlier tests run, and waited
for only when that test needs it (tests/support/prestart.py; `pytest_runtest_setup`
below launches the next server a later test needs); `engine_server`, in the
real-engine run, already while pytest collects (`pytest_sessionstart`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from harness.process import ServerProcess
from harness.server import ENGINE_ARGS, ENGINE_IN_CORE, VLLM_ENGINE_ARGS, VLLM_SERVER, launch
from tests.support import prestart
from tests.support.push import spy_pushes

# `streamproxy gateway` processes the tests start keep their default ledger (on: SQLite) here, not in
# the user's ~/.local/state; one file for the session, which SQLite's locking shares between them.
_LEDGER_DIR = tempfile.mkdtemp(prefix="streamproxy-test-ledger-")
atexit.register(shutil.rmtree, _LEDGER_DIR, True)
os.environ["STREAMPROXY_LEDGER"] = f"sqlite://{_LEDGER_DIR}/ledger.db"

START_TIMEOUT = 600

# Fixtures defined in tests/support, for every folder: `store` (every kind of LedgerStore).
pytest_plugins = ["tests.support.ledger_store"]


# The session's servers start ahead of their first test, while earlier tests run (tests/support/prestart.py).
prestart.define("engine_server", lambda logs: [launch(ENGINE_ARGS, logs, "engine", ENGINE_IN_CORE)])


@pytest.fixture(scope="session")
def engine_server() -> Iterator[str]:
    with prestart.ready("engine_server", START_TIMEOUT) as (server,):
        yield server.base


def _vllm_server(logs: Path) -> list[ServerProcess]:
    from engine_adapter.default_model import DEFAULT_MODEL_NAME, ensure_default_model

    # --enable-scale-out: vLLM's render routes (test_vllm_routes_engine.py compares them), which it serves only with it.
    args = ["--model", str(ensure_default_model(progress=False)), "--served-model-name", DEFAULT_MODEL_NAME, *VLLM_ENGINE_ARGS,
            "--enable-scale-out"]
    return [launch(args, logs, "vllm", ENGINE_IN_CORE, command=None, module=VLLM_SERVER)]


prestart.define("vllm_server", _vllm_server)


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[str]:
    """`python -m vllm.entrypoints.openai.api_server` on the default model, served under the same name
    and engine flags as `engine_server`; its base URL once its /health is 200."""
    with prestart.ready("vllm_server", START_TIMEOUT) as (server,):
        yield server.base


@dataclass
class TracedServer:
    base: str
    receiver: Any  # tests.gateway.test_tracing.Receiver: every span the server and its engine core exported


_RECEIVERS: list[Any] = []  # traced_server's OTLP receiver, made when the server is launched


def _traced_server(logs: Path) -> list[ServerProcess]:
    from tests.gateway.test_tracing import OTLP_HTTP, Receiver

    if not _RECEIVERS:
        _RECEIVERS.append(Receiver())
    # The OTLP variables reach the server and its engine core (which exports vLLM's spans) through the environment.
    return [launch([*ENGINE_ARGS, "--otlp-traces-endpoint", _RECEIVERS[0].url], logs, "traced", {**OTLP_HTTP, **ENGINE_IN_CORE})]


prestart.define("traced_server", _traced_server)


@pytest.fixture(scope="session")
def traced_server() -> Iterator[TracedServer]:
    """`serve` with `engine_server`'s flags and `--otlp-traces-endpoint` (to an OTLP receiver in this process).
    Every request it serves is traced, and a traced request takes vLLM's own output path (its OutputProcessor
    makes vLLM's `llm_request` span; the direct route does not), behind the installed direct route: one engine
    start for engine/test_tracing_engine.py and for engine/test_real_engine.py's comparison of the two routes."""
    try:
        with prestart.ready("traced_server", START_TIMEOUT) as (server,):
            yield TracedServer(server.base, _RECEIVERS[0])
    finally:
        while _RECEIVERS:
            _RECEIVERS.pop().close()


@pytest.fixture(scope="session")
def model_name(engine_server: str) -> str:
    return requests.get(engine_server + "/v1/models", timeout=10).json()["data"][0]["id"]


# `make test-fast` leaves these out (marker `slow`): the client libraries' processes (compat/), the
# property-based fuzzers (fuzz/), the modules that start and kill many processes (test_ledger_process:
# gateway processes SIGTERMed and SIGKILLed, two on one PostgreSQL), and test_frontend_flags, which
# imports vLLM's own `vllm serve` parser (about 7 s of one core, the largest single cost of a fast run),
# and gateway/test_kv_vllm.py, which imports vLLM's KV-event and KV-cache classes for the same price.
# `make test` runs them all.
TESTS = Path(__file__).resolve().parent
SLOW = ("compat/", "fuzz/", "gateway/test_managed.py", "gateway/test_storms.py", "gateway/test_process.py",
        "gateway/test_ledger_process.py", "production/test_api_servers.py", "unit/test_frontend_flags.py",
        "gateway/test_kv_vllm.py")


# Every test in engine/ is an `engine` test (marked here too, whatever its module says), so the runs
# without the engine may leave the folder out (--ignore=tests/engine: not even imported, which saves
# each xdist worker the SDKs' and lm-eval's imports).
ENGINE = "engine/"


def pytest_report_header() -> str:
    """Which aiohttp the run is on (pyproject pins a range; the suite runs on its lowest and highest)."""
    import aiohttp

    return f"aiohttp {aiohttp.__version__}"


def pytest_sessionstart(session: pytest.Session) -> None:
    """The real-engine run (`-m engine`, one process: the Makefile's) launches the session's engine before it collects
    (about 10 s of one core here): nearly every such run needs it, and one that does not stops it once collected."""
    config = session.config
    if config.getoption("markexpr", "") == "engine" and not config.getoption("numprocesses", None) and not config.getoption("collectonly"):
        prestart.early("engine_server")


def pytest_collection_finish(session: pytest.Session) -> None:
    prestart.drop_unneeded(session.items)  # (what `pytest_sessionstart` launched, when no test of the run needs it)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The next real-engine server a later test needs starts now, while this test runs (tests/support/prestart.py)."""
    prestart.ahead(item)


def pytest_sessionfinish() -> None:
    prestart.finish()


# The folders and files that hold `engine` tests: the Makefile's real-engine run collects only these (ENGINE_TESTS; the
# others' imports cost that run ~12 s of a core), so an `engine` test anywhere else fails every collection that sees it
# (the run without the engine and `make test-fast` collect every unit module).
ENGINE_PATHS = ("compat/", "contract/", "engine/", "unit/test_reasoning_vllm.py", "unit/test_vllm_sampling_identity.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        where = item.path.relative_to(TESTS).as_posix()
        if where.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if where.startswith(ENGINE):
            item.add_marker(pytest.mark.engine)
        if item.get_closest_marker("engine") and not where.startswith(ENGINE_PATHS):
            raise pytest.UsageError(f"{item.nodeid} is marked `engine` outside {', '.join(ENGINE_PATHS)}: the Makefile's "
                                    "real-engine run (ENGINE_TESTS) would not collect it; add its path to both")


@pytest.fixture
def pushes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str | None, bool]]:
    """Every call of the writer's push sink: (request id, whether it took the step)."""
    return spy_pushes(monkeypatch)


@pytest.fixture
def parser_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser registries as a process without an engine has them (ours alone), for this test;
    a test then adds what it needs (`vllm_parsers`), and none of it outlives the test."""
    from streamproxy.filters.registry import REASONING_PARSERS, TOOL_PARSERS

    monkeypatch.setattr(TOOL_PARSERS, "sources", [])
    monkeypatch.setattr(REASONING_PARSERS, "sources", [])


@pytest.fixture
def vllm_parsers(parser_registry: None) -> None:
    """vLLM's parser registries beside ours, as the vLLM CLI and engine add them, for this test."""
    from engine_adapter import vllm_parsers

    vllm_parsers.add()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[object]:
    """One real PostgreSQL server for the session (harness/postgres.py), on 127.0.0.1;
    skipped with the reason when pgserver's binaries cannot run on this machine."""
    from harness.postgres import PostgresServer, unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    try:
        server = PostgresServer()
    except Exception as exc:  # the package is there but its server cannot start on this machine
        pytest.skip(f"pgserver's PostgreSQL cannot start here: {type(exc).__name__}: {exc}")
    try:
        yield server
    finally:
        server.close()
