"""A gateway process with managed replicas: `harness.process.ServerProcess` (command "gateway") plus its children.

    with gateway_process(tmp_path, CONFIG_YAML, "--admin-key", "adm") as gw:   # gw.base, gw.url(path)
        gw.deployment("dep-smol")        # GET /v1/deployments/dep-smol, as JSON
        gw.replica_pids()                # the gateway's child processes now (from /proc)

The gateway listens on a free loopback port (the YAML's `port`/`host` are
overridden by flags) and logs to a file (`gw.log()`). On the way out: SIGTERM,
then SIGKILL by pid after a bound; and every replica the gateway was ever seen
to have (`replica_pids`, also read just before stopping it) gets SIGKILL if it
outlives the gateway, so a failed test leaves no process behind.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from harness.process import ServerProcess, free_port
from harness.server import child_env, command_line


def alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


class GatewayProcess(ServerProcess):
    """`streamproxy gateway --config FILE`, and the replicas it was ever seen to have."""

    def __init__(self, config: Path, flags: list[str], log_dir: Path, name: str, env: dict[str, str] | None = None) -> None:
        # Up, not /health: that says 503 while a managed deployment is parked.
        port = free_port()
        super().__init__(command_line("streamproxy", "gateway", port, ["--config", str(config), *flags]), port,
                         log_dir / f"{name}.out", log_dir / f"{name}.err", env=child_env(env), label=name,
                         health_path="/version")
        self.seen: set[int] = set()
        self.start()

    def deployment(self, dep: str) -> dict[str, Any]:
        return requests.get(self.url(f"/v1/deployments/{dep}"), timeout=10).json()

    def state(self, dep: str) -> str:
        return self.deployment(dep)["state"]

    def replica_pids(self) -> list[int]:
        pids = children(self.proc.pid)
        self.seen.update(pids)
        return pids

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.replica_pids()
        return super().stop(timeout)

    def reap_replicas(self) -> None:
        for pid in self.seen:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@contextmanager
def gateway_process(tmp_path: Path, config_yaml: str, *flags: str, name: str = "gateway",
                    env: dict[str, str] | None = None) -> Iterator[GatewayProcess]:
    """`env`: on top of this process's environment, for the gateway and the replicas it starts."""
    config = tmp_path / f"{name}.yaml"
    config.write_text(config_yaml)
    gw = GatewayProcess(config, ["--access-log", "off", *flags], tmp_path, name, env)
    try:
        gw.wait_ready()
        yield gw
    finally:
        gw.stop()
        gw.reap_replicas()
