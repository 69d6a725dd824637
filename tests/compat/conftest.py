"""Fixtures for the client-compatibility suite: real servers, real clients.

Servers (one per test session each, all subprocesses on free loopback ports):

- `fake_server`: `python -m streamproxy serve --engine fake`, the default
  fake text, 10 ms between tokens (each token usually its own chunk).
- `fake_wire_server`: the same with 50 ms between tokens, for byte-exact
  streams (a writer that falls behind may merge two tokens into one chunk).
- `fake_failing_server`: every request fails after two tokens.
- `fake_keepalive_server` / `fake_keepalive_failing_server`: non-stream
  answers preceded by keepalive newlines; the second fails after the 200.
- `fake_heartbeat_server`: SSE keepalive comments between the chunks.
- `fake_tool_server`: the fake engine scripted to answer with a hermes
  `<tool_call>` block, served with `--enable-auto-tool-choice
  --tool-call-parser hermes`.
- `fake_parallel_tool_server`: the same with two calls in one answer.
- `fake_json_server`: the fake engine answering with one JSON object (for
  `response_format` / structured output through the clients).
- `engine_server` / `model_name` (tests/conftest.py): the real vLLM engine
  with the default model, shared with tests/engine.
- `gateway_server`: `python -m streamproxy gateway` in front of a replica
  like `fake_server`'s, as deployment `support-bot` (the replica serves
  `fake`: every name in and out is rewritten); `gateway_wire_server` the
  same in front of a replica like `fake_wire_server`'s, as deployment
  `fake` of a replica serving `fake-replica`, so the exact bytes expected
  of `fake_wire_server` are expected of it too. `kubernetes_gateway_server`:
  a gateway like `gateway_server`'s whose replica is a pod it found
  through a fake Kubernetes API server (a `kubernetes:` deployment).

The fake engine repeats its text until `max_tokens`; the scripted tool and
JSON answers end in `END`, which the tests pass as a stop sequence so the
answer ends with finish_reason "stop" (or "tool_calls"), as a model's would.

`target` runs a test on the fake engine, through the gateway in front of
the fake engine (its replica configured, and found through Kubernetes),
and (marked `engine`) on the real one; `wire_server` runs
a byte-exact test on `fake_wire_server` and on `gateway_wire_server`. `node_runner` and `llamaindex_runner` run the out-of-process clients:
when their runtime is missing a test fails under CI (CI=true) and skips
with the command to fix it on a developer's machine, so a laptop without
Node can still run the rest while CI never passes without them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

from harness.fake_kube import ThreadedFakeKube
from harness.process import ServerProcess
from harness.server import FAKE_ARGS, start_gateway, start_server

ROOT = Path(__file__).resolve().parents[2]
COMPAT = Path(__file__).resolve().parent
NODE_DIR = COMPAT / "node"
LLAMAINDEX_PYTHON = Path(os.environ.get("STREAMPROXY_LLAMAINDEX_PYTHON", ROOT / ".venv" / "llamaindex" / "bin" / "python"))
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")

END = "<|end|>"
TOOL_ARGS = {"city": "Paris", "unit": "celsius"}
PARALLEL_ARGS = [TOOL_ARGS, {"city": "London", "unit": "celsius"}]


def hermes(*calls: dict) -> str:
    """What a hermes-style model writes for these get_weather calls."""
    return "\n".join('<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(a) + "}\n</tool_call>" for a in calls) + END


TOOL_TEXT = hermes(TOOL_ARGS)
PARALLEL_TEXT = hermes(*PARALLEL_ARGS)
JSON_ANSWER = {"city": "Paris", "temperature_c": 21}
JSON_TEXT = json.dumps(JSON_ANSWER) + END
FAKE_TEXT = "Hello! This is a fake streamed answer. "
TOKEN_DELAY = 0.01
START_TIMEOUT = 30

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temperature_c": {"type": "integer"}},
    "required": ["city", "temperature_c"],
    "additionalProperties": False,
}


def _start_fake(tmp_path_factory: pytest.TempPathFactory, name: str, args: list[str]) -> ServerProcess:
    """`python -m streamproxy serve --engine fake --access-log off ARGS`, ready; the fixture stops it."""
    return start_server([*FAKE_ARGS, *args], tmp_path_factory.mktemp(name), name=name, timeout=START_TIMEOUT)


@pytest.fixture(scope="session")
def fake_server(tmp_path_factory: pytest.TempPathFactory):
    server = _start_fake(tmp_path_factory, "fake", ["--fake-token-delay", str(TOKEN_DELAY), "--fake-text", FAKE_TEXT])
    yield server.base
    server.stop()


@pytest.fixture(scope="session")
def fake_wire_server(tmp_path_factory: pytest.TempPathFactory):
    """Slow tokens (50 ms), so every token is its own write: exact bytes for curl."""
    server = _start_fake(tmp_path_factory, "fake-wire", ["--fake-token-delay", "0.05", "--fake-text", FAKE_TEXT])
    yield server.base
    server.stop()


@pytest.fixture(scope="session")
def fake_failing_server(tmp_path_factory: pytest.TempPathFactory):
    """Every request fails after 2 tokens: an in-band error event mid-stream, a 500 otherwise."""
    server = _start_fake(tmp_path_factory, "fake-failing", ["--fake-fail-after", "2", "--fake-token-delay", str(TOKEN_DELAY)])
    yield server.base
    server.stop()


KEEPALIVE_ARGS = ["--fake-ttft", "0.3", "--nonstream-keepalive-after", "0.05", "--nonstream-keepalive-interval", "0.05"]


@pytest.fixture(scope="session")
def fake_keepalive_server(tmp_path_factory: pytest.TempPathFactory):
    """A slow first token (0.3 s) and non-stream keepalive after 0.05 s: newlines before the JSON."""
    server = _start_fake(tmp_path_factory, "fake-keepalive", KEEPALIVE_ARGS)
    yield server.base
    server.stop()


@pytest.fixture(scope="session")
def fake_keepalive_failing_server(tmp_path_factory: pytest.TempPathFactory):
    """As fake_keepalive_server, but the engine fails after the early 200 went out."""
    server = _start_fake(tmp_path_factory, "fake-keepalive-failing", [*KEEPALIVE_ARGS, "--fake-fail-after", "1"])
    yield server.base
    server.stop()


@pytest.fixture(scope="session")
def fake_heartbeat_server(tmp_path_factory: pytest.TempPathFactory):
    """Slow tokens (0.12 s) and an SSE heartbeat every 0.05 s of silence: `: keepalive` comments mid-stream."""
    args = ["--sse-heartbeat", "0.05", "--fake-ttft", "0.2", "--fake-token-delay", "0.12"]
    server = _start_fake(tmp_path_factory, "fake-heartbeat", args)
    yield server.base
    server.stop()


@pytest.fixture(scope="session")
def fake_tool_server(tmp_path_factory: pytest.TempPathFactory):
    args = ["--fake-text", TOOL_TEXT, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    server = _start_fake(tmp_path_factory, "fake-tools", args)
    yield server.base
    server.stop()


@pytest.fixture(scope="session")
def fake_parallel_tool_server(tmp_path_factory: pytest.TempPathFactory):
    args = ["--fake-text", PARALLEL_TEXT, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    server = _start_fake(tmp_path_factory, "fake-parallel-tools", args)
    yield server.base
    server.stop()


@pytest.fixture(scope="session")
def fake_json_server(tmp_path_factory: pytest.TempPathFactory):
    server = _start_fake(tmp_path_factory, "fake-json", ["--fake-text", JSON_TEXT])
    yield server.base
    server.stop()


GATEWAY_MODEL = "support-bot"


def _start_gateway(tmp_path_factory: pytest.TempPathFactory, name: str, replica: ServerProcess, deployment: str, served: str) -> ServerProcess:
    config = {
        "access_log": "off",
        "deployments": [{"name": deployment, "id": f"dep-{name}", "served_model": served, "upstreams": [replica.base]}],
    }
    return start_gateway(config, tmp_path_factory.mktemp(name), name=name, timeout=START_TIMEOUT)


@pytest.fixture(scope="session")
def gateway_server(tmp_path_factory: pytest.TempPathFactory):
    """The gateway in front of a replica like fake_server's (served as `fake`), as deployment `support-bot`."""
    replica = _start_fake(tmp_path_factory, "gateway-replica", ["--fake-token-delay", str(TOKEN_DELAY), "--fake-text", FAKE_TEXT])
    gateway = _start_gateway(tmp_path_factory, "gateway", replica, GATEWAY_MODEL, "fake")
    yield gateway.base
    gateway.stop()
    replica.stop()


@pytest.fixture(scope="session")
def kubernetes_gateway_server(tmp_path_factory: pytest.TempPathFactory):
    """The gateway in front of a replica like fake_server's, found as a pod through a fake Kubernetes API
    server (harness/fake_kube.py, in a thread) by a `kubernetes:` deployment `support-bot`."""
    replica = _start_fake(tmp_path_factory, "k8s-replica", ["--fake-token-delay", str(TOKEN_DELAY), "--fake-text", FAKE_TEXT])
    threaded = ThreadedFakeKube()
    kube = threaded.start()
    port = int(replica.base.rsplit(":", 1)[1])
    threaded.call(kube.add_pod, "fake-0", {"app": "fake"}, port=port, ready=True)
    folder = tmp_path_factory.mktemp("k8s-gateway")
    kubeconfig = kube.kubeconfig(folder / "kubeconfig")
    section = {"namespace": "llm", "selector": {"app": "fake"}, "port": "http", "kubeconfig": kubeconfig}
    config = {"access_log": "off", "deployments": [{"name": GATEWAY_MODEL, "id": "dep-k8s", "served_model": "fake", "kubernetes": section}]}
    gateway = start_gateway(config, folder, name="k8s-gateway", timeout=START_TIMEOUT)
    yield gateway.base
    gateway.stop()
    threaded.stop()
    replica.stop()


@pytest.fixture(scope="session")
def gateway_wire_server(tmp_path_factory: pytest.TempPathFactory):
    """The gateway in front of a replica like fake_wire_server's that serves `fake-replica`, as deployment `fake`."""
    replica = _start_fake(
        tmp_path_factory, "gateway-wire-replica", ["--fake-token-delay", "0.05", "--fake-text", FAKE_TEXT, "--served-model-name", "fake-replica"]
    )
    gateway = _start_gateway(tmp_path_factory, "gateway-wire", replica, "fake", "fake-replica")
    yield gateway.base
    gateway.stop()
    replica.stop()


@pytest.fixture(params=["fake", "gateway"])
def wire_server(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("fake_wire_server" if request.param == "fake" else "gateway_wire_server")


@dataclass
class Target:
    kind: str  # "fake", "gateway" (in front of the fake engine) or "engine"
    base: str
    model: str

    @property
    def v1(self) -> str:
        return self.base + "/v1"

    @property
    def real(self) -> bool:
        return self.kind == "engine"


@pytest.fixture(params=[pytest.param("fake"), pytest.param("gateway"), pytest.param("kubernetes"),
                        pytest.param("engine", marks=pytest.mark.engine)])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "fake":
        return Target("fake", request.getfixturevalue("fake_server"), "fake")
    if request.param == "gateway":
        return Target("gateway", request.getfixturevalue("gateway_server"), GATEWAY_MODEL)
    if request.param == "kubernetes":  # the same gateway, its replica found through the Kubernetes API
        return Target("gateway", request.getfixturevalue("kubernetes_gateway_server"), GATEWAY_MODEL)
    return Target("engine", request.getfixturevalue("engine_server"), request.getfixturevalue("model_name"))


@pytest.fixture
def engine_target(engine_server: str, model_name: str) -> Target:
    return Target("engine", engine_server, model_name)


def missing_runtime(what: str, fix: str) -> NoReturn:
    """Fail under CI, skip (saying how to fix it) on a developer's machine."""
    message = f"{what}; {fix}"
    if IN_CI:
        pytest.fail(f"{message} (CI=true: the compat suite must run every client)", pytrace=False)
    pytest.skip(f"{message} (this fails under CI)")


def _run_json(cmd: list[str], config: dict[str, Any], client: str, cwd: Path, timeout: float) -> dict[str, Any]:
    proc = subprocess.run(cmd, input=json.dumps(config), capture_output=True, text=True, cwd=cwd, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{client}: {' '.join(cmd[1:])} exited with {proc.returncode}\nstderr:\n{proc.stderr[-4000:]}\nstdout:\n{proc.stdout[-2000:]}", pytrace=False)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        pytest.fail(f"{client}: no JSON result line on stdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-2000:]}", pytrace=False)


@pytest.fixture(scope="session")
def node_runner():
    node = shutil.which("node")
    if node is None:
        missing_runtime("node is not installed", "install Node 20 and run `make test` (it runs `npm ci` in tests/compat/node)")
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        pytest.fail(f"node clients not installed: run `npm ci` in {NODE_DIR} (make test does)", pytrace=False)

    def run(script: str, config: dict[str, Any], client: str, timeout: float = 180) -> dict[str, Any]:
        return _run_json([node, str(NODE_DIR / script)], config, client, NODE_DIR, timeout)

    return run


@pytest.fixture(scope="session")
def llamaindex_runner():
    if not LLAMAINDEX_PYTHON.exists():
        missing_runtime(
            f"LlamaIndex's virtualenv is missing ({LLAMAINDEX_PYTHON})",
            "run `make test` (it builds .venv/llamaindex from tests/compat/llamaindex/requirements.txt)",
        )

    def run(config: dict[str, Any], timeout: float = 180) -> dict[str, Any]:
        # A module of the tests package, run from the repository root: it imports tests.compat.capture
        # from there (tests/__init__.py and tests/compat/__init__.py import nothing, so LlamaIndex's
        # venv needs none of the main one's packages).
        return _run_json([str(LLAMAINDEX_PYTHON), "-m", "tests.compat.llamaindex.client"], config, "llamaindex", ROOT, timeout)

    return run


@pytest.fixture
def wire():
    """What the Python clients of one test received (see capture.py)."""
    from tests.compat.capture import Wire

    return Wire()
