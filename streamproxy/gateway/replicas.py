"""A managed replica's process: started, watched, signalled, its log's tail.

`spawn` runs `python -m streamproxy serve --host 127.0.0.1 --port <free> ...`
(`replica_command`) with its output in a log file, in a new session (its own
process group, so a signal reaches vLLM's engine processes too, and a
terminal's Ctrl-C reaches only the gateway), and with Linux's parent-death
signal set to SIGTERM in the child before exec: a gateway killed with SIGKILL
still takes its replicas with it (they drain and exit). `watch` calls back
on the event loop the moment the process exits (a pidfd; polling where
there is none), after reaping it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from streamproxy.gateway.config import Deployment, KVEventsEndpoint, Launch
from streamproxy.oscalls import die_with_parent

_LOG_TAIL_LINES = 30


def _child_setup(parent: int) -> Callable[[], None]:
    """In the child, before exec: SIGTERM when the gateway dies (and exit now if it already did)."""

    def setup() -> None:
        die_with_parent(signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    return setup


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(eq=False)
class ReplicaProcess:
    slot: int
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float
    up: bool = False  # answered /health and is in the pool
    expected: bool = False  # the gateway asked it to stop
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    kv_events: KVEventsEndpoint | None = None  # where it publishes its KV-cache events

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.returncode is not None:  # reaped: the pid may be someone else's now
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def kv_events_for(deployment: Deployment, launch: Launch) -> KVEventsEndpoint | None:
    """Where a new replica will publish its KV-cache events: a vLLM replica on free loopback ports,
    unless the deployment's `kv_events` turns them off or its args give their own `--kv-events-config`
    (then read from it; `*` is this host)."""
    config = deployment.kv_events
    if launch.model == "fake" or (config is not None and not config.enable_kv_cache_events):
        return None
    own = _flag(launch.args, "--kv-events-config")
    if own is not None:
        try:
            given = json.loads(own)
        except ValueError:
            return None
        if not isinstance(given, dict) or not given.get("enable_kv_cache_events") or given.get("publisher", "null") != "zmq":
            return None
        endpoint = str(given.get("endpoint", "tcp://*:5557"))
        replay = given.get("replay_endpoint")
        return KVEventsEndpoint(endpoint=endpoint.replace("*", "127.0.0.1"), bind="*" not in endpoint,
                                replay_endpoint=str(replay).replace("*", "127.0.0.1") if replay else None,
                                topic=str(given.get("topic", "")))
    return KVEventsEndpoint(endpoint=f"tcp://127.0.0.1:{free_port()}", replay_endpoint=f"tcp://127.0.0.1:{free_port()}",
                            topic=config.topic if config is not None else "", bind=True)


def kv_events_flag(kv: KVEventsEndpoint, buffer_steps: int) -> list[str]:
    """vLLM's `--kv-events-config` for a replica publishing at `kv` (its PUB connects to the gateway's SUB)."""
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv.endpoint,
              "replay_endpoint": kv.replay_endpoint, "buffer_steps": buffer_steps, "topic": kv.topic}
    return ["--kv-events-config", json.dumps(config, separators=(",", ":"))]


def _flag(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg[len(name) + 1:]
    return None


def replica_command(deployment: Deployment, launch: Launch, port: int, kv: KVEventsEndpoint | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "streamproxy", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--engine", "fake"] if launch.model == "fake" else ["--model", launch.model]
    if "--served-model-name" not in launch.args:
        cmd += ["--served-model-name", deployment.upstream_model]
    if "--access-log" not in launch.args:
        cmd += ["--access-log", "off"]  # the gateway logs each request; the replica's log keeps the rest
    if kv is not None and _flag(launch.args, "--kv-events-config") is None:
        cmd += kv_events_flag(kv, deployment.kv_events.buffer_steps if deployment.kv_events is not None else 10_000)
    return cmd + list(launch.args)


def spawn(deployment: Deployment, launch: Launch, slot: int, log_dir: Path) -> ReplicaProcess:
    """Start one replica (raises OSError when it cannot be started at all)."""
    port = free_port()
    kv = kv_events_for(deployment, launch)
    log_path = log_dir / f"{deployment.id}-{slot}-{port}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            replica_command(deployment, launch, port, kv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
            # The parent-death signal has no other way in; the child runs nothing but prctl
            # and getppid before exec. Forked from the loop thread: the signal is tied to it.
            preexec_fn=_child_setup(os.getpid()),  # noqa: PLW1509
        )
    return ReplicaProcess(slot, port, proc, log_path, time.monotonic(), kv_events=kv)


def watch(rp: ReplicaProcess, on_exit: Callable[[ReplicaProcess], None]) -> None:
    """`on_exit(rp)` on the running loop once the process has exited and is reaped."""
    loop = asyncio.get_running_loop()

    def done() -> None:
        rp.proc.wait()
        rp.exited.set()
        on_exit(rp)

    try:
        fd = os.pidfd_open(rp.pid)
    except (OSError, AttributeError):  # no pidfd (not Linux >= 5.3): poll
        loop.create_task(_poll(rp, done))
        return

    def readable() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        done()

    loop.add_reader(fd, readable)


async def _poll(rp: ReplicaProcess, done: Callable[[], None]) -> None:
    while rp.proc.poll() is None:
        await asyncio.sleep(0.1)
    done()
