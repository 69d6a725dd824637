"""Profile a streamproxy server under streaming load with py-spy, and summarise it.

    python -m bench.profile                       # fake engine, 256 streams, 15 s
    python -m bench.profile --model tiny -c 256   # real vLLM engine in-process (tiny model)
    python -m bench.profile --model tiny --regime gpu -c 1024   # on the stand-in engine (bench/gpu.py)

The server is started as a child process, warmed up, then loaded by
bench/loadgen.py (counting mode) while `py-spy record` samples it. py-spy
runs with `--gil` (only the thread holding the GIL is sampled: that is where
Python CPU goes; a thread parked on a lock or in epoll is not counted, and on
a busy 2-core machine a runnable-but-descheduled thread is not either) and
`--nonblocking` (the server is not paused per sample). The server's CPU per
streamed chunk is measured over the same window, so each function's share can
also be read as microseconds per chunk.

Output: bench/results/profile-<target>-c<C>-<time>.speedscope.json (open at
https://www.speedscope.app) and ...-top.txt (top functions by self and total
time).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from .servers import RESULTS, Server


def pyspy_path() -> str:
    return shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def start_record(pid: int, seconds: float, out: Path, *, rate: int = 200, gil: bool = True,
                 native: bool = False) -> subprocess.Popen:
    cmd = [pyspy_path(), "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate", str(rate),
           "--format", "speedscope", "-o", str(out)]
    if not native:  # native unwinding needs the target paused per sample
        cmd.append("--nonblocking")
    if gil:
        cmd.append("--gil")
    if native:
        cmd.append("--native")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _short(frame: dict) -> str:
    file = frame.get("file") or ""
    for marker in ("site-packages/", "/work/main/", "lib/python3."):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{frame['name']} ({file}:{frame.get('line', '')})"


def summarize_speedscope(path: Path, top: int = 30, us_per_chunk: float | None = None,
                         by_line: bool = False) -> str:
    """Self and total shares per function (all sampled threads together).

    Functions are merged over their lines unless `by_line`. With
    `us_per_chunk`, each share is also shown as µs of server CPU per chunk.
    """
    data = json.loads(path.read_text())
    frames = data["shared"]["frames"]

    def key(i: int) -> str:
        f = frames[i]
        if by_line:
            return _short(f)
        return _short({**f, "line": ""}).replace(":)", ")")

    self_c: Counter[str] = Counter()
    total_c: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    n = 0.0
    count = 0
    for prof in data["profiles"]:
        weights = prof.get("weights") or [1] * len(prof["samples"])
        for stack, w in zip(prof["samples"], weights):
            if not stack:
                continue
            n += w
            count += 1
            threads[prof.get("name", "?")] += w
            self_c[key(stack[-1])] += w
            for k in {key(i) for i in stack}:
                total_c[k] += w

    def line(k: str, c: float) -> str:
        pct = c / n * 100
        extra = f"  {pct / 100 * us_per_chunk:6.2f} µs/chunk" if us_per_chunk else ""
        return f"  {pct:5.1f}%{extra}  {k}"

    out = [f"{count} samples ({n:.1f} s) with the GIL held; per thread: "
           + ", ".join(f"{t} {c / n * 100:.0f}%" for t, c in threads.most_common())]
    if us_per_chunk:
        out.append(f"server CPU over the profiled window: {us_per_chunk:.2f} µs per chunk")
    out += ["", "top by self time (the function's own code, C calls it makes without a Python frame included):"]
    out += [line(k, c) for k, c in self_c.most_common(top)]
    out += ["", "top by total time (the function and everything it calls):"]
    out += [line(k, c) for k, c in total_c.most_common(top)]
    return "\n".join(out)


# The parts of a streamed chunk's cost, by the sampled stack (`chunk_parts`): first match wins.
_VLLM = "vLLM output (IPC decode, output handler, direct route)"
PARTS = ("socket write", "writer (framing, bookkeeping)", "encoder", "DeltaQueue.put", "fake engine step", _VLLM,
         "request handling", "event loop, timers, other")
# The engine's step, whose stacks hold the stream's per-token work: the fake engine's loop, or vLLM's output
# handler task (its IPC decode, then engine_adapter/vllm_direct.py's route into each stream's queue).
_STEP = ("FakeEngine._step_loop", "FakeEngine.step", "AsyncLLM._run_output_handler.<locals>.output_handler")


def _source_line(file: str, line: int) -> str:
    try:
        with open(file) as f:
            for i, text in enumerate(f, 1):
                if i == line:
                    return text
    except OSError:
        pass
    return ""


def _part(stack: list[dict], lines: dict[tuple[str, int], str], moved: tuple[str, str] | None = None) -> str:
    leaf = stack[-1]
    file, name, line = leaf.get("file") or "", leaf["name"], leaf.get("line") or 0
    if "streamproxy/http/body.py" in file and (name.startswith("StreamBody.") or name == "_write_batch"):
        source = file.replace(*moved) if moved else file
        src = lines.setdefault((file, line), _source_line(source, line)).strip()
        # The transport's write (the syscall included: uvloop holds the GIL through it). py-spy
        # charges some of its samples to the sink's `return True` right after it.
        if "transport.write(" in src or (src == "return True" and name.startswith("StreamBody.")):
            return "socket write"
        return "writer (framing, bookkeeping)"
    if name == "FastHistogram.observe" or (name == "chunk_frame" and "http/body.py" in file):
        return "writer (framing, bookkeeping)"
    names = [f["name"] for f in stack]
    files = [f.get("file") or "" for f in stack]
    in_step = any(n in _STEP for n in names)
    if in_step or "_write_batch" in names:
        if "streamproxy/core/" in file:
            return "encoder"
        if name.startswith("DeltaQueue."):
            return "DeltaQueue.put"
        if "engine_adapter/fake.py" in file or "engine_adapter/base.py" in file:
            return "fake engine step" if any(n.startswith("FakeEngine.") for n in names) else _VLLM
        if "engine_adapter/vllm" in file or "/vllm/" in file or "/zmq/" in file:
            return _VLLM
        if any("streamproxy/core/" in f for f in files):
            return "encoder"
        if any(n.startswith("StreamBody.") for n in names):
            return "writer (framing, bookkeeping)"
        return "event loop, timers, other"
    if any("aiohttp/" in f or "streamproxy/http/" in f for f in files):
        return "request handling"
    return "event loop, timers, other"


def chunk_parts(path: Path, us_per_chunk: float, moved: tuple[str, str] | None = None) -> dict[str, float]:
    """µs per chunk by part (`PARTS`): each part's share of the GIL-held samples x the CPU per chunk.

    The writer's lines are told apart by their source text, read from the profiled files
    (`moved=(old, new)`: from `new` instead, for a profile of code that has changed since).
    """
    data = json.loads(path.read_text())
    frames = data["shared"]["frames"]
    counts: Counter[str] = Counter()
    lines: dict[tuple[str, int], str] = {}
    total = 0.0
    for prof in data["profiles"]:
        weights = prof.get("weights") or [1] * len(prof["samples"])
        for stack, w in zip(prof["samples"], weights):
            if stack:
                counts[_part([frames[i] for i in stack], lines, moved)] += w
                total += w
    return {part: counts[part] / total * us_per_chunk for part in PARTS} if total else {}


def profile_under_load(srv: Server, conc: int, seconds: float, endpoint: str, max_tokens: int,
                       out: Path, *, rate: int = 200, native: bool = False, gil: bool = True) -> dict:
    """Load the server at `conc` streams and record it; returns paths, CPU/chunk and the summary."""
    import uvloop

    from .fake_capacity import _level  # the same measured closed loop as the capacity benchmark

    spy = start_record(srv.pid, seconds, out, rate=rate, gil=gil, native=native)
    try:
        time.sleep(1.0)  # attach
        # CPU per chunk of the front end alone (a real engine's core and workers are its descendants).
        level = uvloop.run(_level(srv, conc, seconds, endpoint, max_tokens, warm=False, pids=srv.frontend_pids()))
        log = spy.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if spy.poll() is None:
            spy.terminate()
            spy.wait(10)
    if not out.exists():
        raise RuntimeError(f"py-spy wrote nothing:\n{log[-2000:]}")
    summary = summarize_speedscope(out, us_per_chunk=level["us_per_chunk"])
    parts = chunk_parts(out, level["us_per_chunk"])
    summary += "\n\nµs per chunk by part:\n" + "\n".join(f"  {us:6.2f}  {part}" for part, us in parts.items())
    txt = out.with_name(out.name.replace(".speedscope.json", "-top.txt"))
    txt.write_text(summary + "\n")
    return {"speedscope": str(out), "summary_file": str(txt), "level": level, "summary": summary, "parts": parts}


def main(argv: list[str] | None = None) -> int:
    from . import compare, gpu, servers
    from .standin_model import StepModel

    ap = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="fake", help="fake (default), tiny, smollm2, or a model folder")
    ap.add_argument("-c", "--concurrency", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("--token-delay", type=float, default=0.02, help="fake engine step interval")
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--native", action="store_true", help="also sample C frames (py-spy --native)")
    ap.add_argument("--no-gil", action="store_true", help="sample every thread, not only the GIL holder")
    ap.add_argument("--engine-args", default=None,
                    help=f"default {compare.DEFAULT_ENGINE_ARGS!r}; --regime gpu: {gpu.ENGINE_ARGS!r}")
    ap.add_argument("--regime", choices=["cpu", "gpu"], default="cpu",
                    help="gpu: the real engine core with the stand-in forward pass (bench/standin.py; its default "
                         "step model), as `make bench-gpu` runs it; the parts breakdown is the fake engine's")
    ap.add_argument("--server-args", default="", help="extra streamproxy flags")
    ap.add_argument("--parts", type=Path, metavar="SPEEDSCOPE",
                    help="only break a recorded profile down by part (with --us-per-chunk) and exit")
    ap.add_argument("--us-per-chunk", type=float, default=1.0, help="the CPU per chunk over the profiled window")
    ap.add_argument("--moved", default=None, metavar="OLD=NEW",
                    help="with --parts: read the profiled sources under NEW where the profile says OLD")
    args = ap.parse_args(argv)
    if args.parts:
        moved = tuple(args.moved.split("=", 1)) if args.moved else None
        for part, us in chunk_parts(args.parts, args.us_per_chunk, moved).items():
            print(f"{us:6.2f}  {part}")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    extra = shlex.split(args.server_args)
    if args.model == "fake":
        srv = servers.fake_server(["--fake-token-delay", str(args.token_delay), *extra], f"{stamp}-profile")
        label = "fake"
    else:
        path, label = compare.model_path(args.model), compare.model_label(args.model)
        env = {"VLLM_CPU_KVCACHE_SPACE": "2"}
        if args.regime == "gpu":
            eargs = shlex.split(args.engine_args or gpu.ENGINE_ARGS)
            env = {"VLLM_CPU_KVCACHE_SPACE": gpu.KV_CACHE_GIB, **StepModel().env(), "PYTHONPATH": str(servers.ROOT)}
            label += "-standin"
        else:
            eargs = shlex.split(args.engine_args or compare.DEFAULT_ENGINE_ARGS)
            if args.model == "tiny":
                eargs += shlex.split(compare.DEFAULT_TINY_ARGS)
        srv = servers.streamproxy_server(path, eargs, f"{stamp}-profile-{label}", env, extra)
    out = RESULTS / f"profile-{label}-c{args.concurrency}-{stamp}.speedscope.json"
    srv.start()
    try:
        srv.wait_ready()
        if args.model != "fake":
            compare.warm_up(srv, args.concurrency, args.endpoint, srv.model_id())
        res = profile_under_load(srv, args.concurrency, args.seconds, args.endpoint, args.max_tokens, out,
                                 rate=args.rate, native=args.native, gil=not args.no_gil)
    finally:
        srv.stop(30)
    print(res["summary"])
    print(f"\nwrote {res['speedscope']}\n      {res['summary_file']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
