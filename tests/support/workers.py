"""`streamproxy serve --api-server-count N` processes for the tests, and what they say about themselves.

    with api_servers(2, "--fake-token-delay", "0.05") as srv:   # fake engine, access log to a file
        srv.pids()            # the workers' pids (children of the parent, from /proc)
        srv.log_lines()       # the access log, parsed: each line has "pid"
        srv.metric("streamproxy_responses_total", status="200")   # the sum over the workers, as /metrics says

Ready means every worker listens (a spawned worker imports everything anew: on a machine
busy with others' benchmarks that took over a minute, hence the generous bound): the parent's port is served only by
listening workers (SO_REUSEPORT), so /health answering is not enough; the
workers' "listening on" lines are counted in the log first.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import requests

from harness.process import ServerFailed, ServerProcess
from harness.server import launch, wait_workers


class ApiServers:
    def __init__(self, server: ServerProcess, count: int, access_log: Path) -> None:
        self.server = server
        self.count = count
        self.access_log = access_log
        self.base = server.base

    def url(self, path: str) -> str:
        return self.server.url(path)

    def pids(self) -> set[int]:
        try:
            return {child.pid for child in psutil.Process(self.server.proc.pid).children()
                    if "spawn_main" in " ".join(child.cmdline())}  # not multiprocessing's resource tracker
        except psutil.Error:
            return set()

    def log_lines(self) -> list[dict]:
        if not self.access_log.exists():
            return []
        return [json.loads(line) for line in self.access_log.read_text().splitlines() if line.strip()]

    def metrics_text(self) -> str:
        return requests.get(self.url("/metrics"), timeout=10).text

    def metric(self, name: str, text: str | None = None, **labels: str) -> float:
        """The value of one sample (`name` with exactly `labels` among its labels), summed if several match."""
        total = 0.0
        for line in (text if text is not None else self.metrics_text()).splitlines():
            if line.startswith("#") or not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            sample, _, label_text = head.partition("{")
            if sample != name:
                continue
            if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
                total += float(value)
        return total


def launch_api_servers(count: int, *flags: str, engine: tuple[str, ...] = ("--engine", "fake"), log_dir: Path,
                       attempt: int = 0) -> ServerProcess:
    """The parent `api_servers` starts (not yet ready), its access log `log_dir/access.log`: launched ahead
    (tests/support/prestart.py), it is handed to `api_servers(..., launched=...)` with the same arguments."""
    return launch([*engine, "--api-server-count", str(count), "--access-log", str(log_dir / "access.log"), *flags], log_dir,
                  name=f"api-servers-{attempt}" if attempt else "api-servers")


@contextmanager
def api_servers(count: int, *flags: str, engine: tuple[str, ...] = ("--engine", "fake"), timeout: float = 240.0,
                log_dir: Path | None = None, retry_unanswered_start: bool = False,
                launched: ServerProcess | None = None) -> Iterator[ApiServers]:
    """A parent with `count` ready workers for the `with` block; SIGTERM after it (the caller may stop it first).
    `launched`: the first attempt's parent, already started by `launch_api_servers` (same arguments, `log_dir`).

    `retry_unanswered_start`: a start whose shared vLLM engine core came up but did not answer the
    workers' first call (engine_adapter/vllm_engine.py FIRST_CALL_TIMEOUT: the workers exit 1, and
    the parent) is tried once more, with a fresh engine; seen in two full runs (CI's, and a fresh
    clone's here; not in 35 starts alone), its cause not found. Any other failure fails at once."""
    with tempfile.TemporaryDirectory(prefix="streamproxy-workers-") as tmp:
        folder = log_dir or Path(tmp)
        access = folder / "access.log"
        for attempt in range(2 if retry_unanswered_start else 1):
            if attempt == 0 and launched is not None:
                server = launched
            else:
                server = launch_api_servers(count, *flags, engine=engine, log_dir=folder, attempt=attempt)
            srv = ApiServers(server, count, access)
            try:
                wait_workers(server, count, timeout)
                server.wait_ready(timeout)
            except ServerFailed as exc:
                server.stop(30)
                if not retry_unanswered_start or attempt or "did not answer its first call" not in exc.log:
                    raise
                said = [line for line in exc.log.splitlines() if not line.lstrip().startswith(("nanobind:", "- leaked", "See https://nanobind"))]
                warnings.warn("the shared engine core did not answer the first call; starting again:\n" + "\n".join(said[-80:]),
                              stacklevel=3)  # (the test's `with`)
                continue
            reasked = [line for line in server.log().splitlines() if "the engine core has not answered" in line or "the engine core answered" in line]
            if reasked:  # a first call answered only when asked again (engine_adapter/first_call.py): say so in the run's output
                warnings.warn("the shared engine core answered the first call only when asked again:\n" + "\n".join(reasked),
                              stacklevel=3)
            try:
                yield srv
            finally:
                server.stop(30)
            return
