"""What one streamed chat request costs `streamproxy serve`'s process on the way to its first token.

    python -m bench.first_token [--requests 256] [--concurrency 64] [--rounds 5] [--max-tokens 1]

`streamproxy serve` runs in this process (the real code: `cli.build`, `server.serve`, uvloop) over
the stand-in engine (bench/standin.py: vLLM's engine core in its own process, the forward pass a
timed sleep) and the tiny model. A client in a child process sends the loadgen's streaming chat
request (47 prompt tokens, `max_tokens` 1 by default: the request is its first token and its end)
`--requests` times per round, `--concurrency` at a time over keep-alive connections, and reads
every response to its end. Per round: this process's CPU (all its threads: the event loop and
vLLM's ZMQ threads) over the round / requests. Rounds alternate: plain, then under cProfile (the
event loop's thread only), which gives Python and C calls per request and, from each part's
cumulative time, a per-part breakdown (µs per request under the profiler: inflated, read as
shares). The engine core's own CPU is not counted. Min / median / max over the rounds of each kind.
Needs the heavy lock (an engine start, about 20 s): `flock /work/notes/heavy.lock python -m ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVED = "bench"

# (label, ((file suffix, function name), ...)): a part of the request is the cumulative time of its functions.
PARTS = [
    ("HTTP request in (aiohttp parse, body read, JSON decode)", (("routes/body.py", "decode_body"),)),
    ("prepare (params, chat template, tokenize)", (("core/prepare.py", "prepare"),)),
    ("  chat template (jinja)", (("transformers/tokenization_utils_base.py", "apply_chat_template"),)),
    ("  tokenize (Rust fast path)", (("engine_adapter/fast_encode.py", "encode"),)),
    ("engine generate (all of it)", (("engine_adapter/vllm_engine.py", "generate"),)),
    ("  SamplingParams", (("engine_adapter/vllm_params.py", "sampling_params"),
                          ("engine_adapter/vllm_params.py", "__call__"))),  # before / after the builder
    ("  vLLM process_inputs", (("v1/engine/input_processor.py", "process_inputs"),)),
    ("    of it the EOS id", (("renderers/base.py", "get_eos_token_id"),)),
    ("  ZMQ send to the engine core", (("v1/engine/core_client.py", "add_request_async"),)),
    ("response head (aiohttp prepare)", (("aiohttp/web_response.py", "prepare"),)),
    ("vLLM output handler (outputs in)", (("v1/engine/async_llm.py", "output_handler"),)),
    ("  direct route", (("engine_adapter/vllm_direct.py", "process_outputs"),)),
]


def _client_main(port: int, concurrency: int, max_tokens: int) -> None:
    """The child: on "N\\n" from stdin send N requests (`concurrency` at a time), then print "done"."""
    import orjson

    from bench.loadgen import build_request, request_body

    request = build_request("127.0.0.1", port, "/v1/chat/completions",
                            request_body("chat", SERVED, max_tokens, ignore_eos=True))
    health = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"bad response: {head[:200]!r}")
        body = bytearray()
        while not body.endswith(b"0\r\n\r\n") or b"[DONE]" not in body:
            chunk = await reader.read(65536)
            if not chunk:
                raise SystemExit("connection closed mid-response")
            body += chunk

    async def worker(left: list[int]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while left[0] > 0:
            left[0] -= 1
            await one(reader, writer)
        writer.close()

    async def wait_ready() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(health)
                head = await reader.readuntil(b"\r\n\r\n")
                writer.close()
                if head.startswith(b"HTTP/1.1 200"):
                    return
            except OSError:
                pass
            await asyncio.sleep(0.5)
        raise SystemExit("the server never became healthy")

    async def run() -> None:
        await wait_ready()
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            left = [int(line)]
            await asyncio.gather(*(worker(left) for _ in range(min(concurrency, left[0]))))
            print("done", flush=True)

    del orjson
    asyncio.run(run())


def _parts(profile: cProfile.Profile, requests: int) -> tuple[float, dict[str, float]]:
    stats = pstats.Stats(profile)
    calls = sum(nc for (_, _, _), (_, nc, _, _, _) in stats.stats.items())  # type: ignore[attr-defined]
    parts: dict[str, float] = {}
    for label, functions in PARTS:
        total = 0.0
        for (file, _, func), (_, _, _, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
            if any(func == name and file.endswith(suffix) for suffix, name in functions):
                total += ct
        parts[label] = total / requests * 1e6
    return calls / requests, parts


async def _bench(args: argparse.Namespace) -> None:
    from engine_adapter.default_model import build_tiny_model
    from streamproxy import cli
    from streamproxy.http import server

    from .gpu import ENGINE_ARGS

    model = str(build_tiny_model(progress=False))
    argv = ["serve", "--model", model, "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(args.port),
            *ENGINE_ARGS.split(), *args.serve_args.split()]
    settings, engine = cli.build(argv[1:])
    serving = asyncio.create_task(server.serve(settings, engine, hard_exit=True))  # as `run` serves
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.first_token", "--client", str(args.port), "--concurrency", str(args.concurrency),
        "--max-tokens", str(args.max_tokens), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert client.stdin is not None and client.stdout is not None

    async def round_(n: int) -> None:
        client.stdin.write(f"{n}\n".encode())  # type: ignore[union-attr]
        await client.stdin.drain()  # type: ignore[union-attr]
        line = await client.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != b"done":
            raise SystemExit(f"the client failed: {line!r}")

    try:
        if (await client.stdout.readline()).strip() != b"ready":
            raise SystemExit("the client did not start")
        await round_(args.requests)  # warm-up (first-call paths, caches)
        cpu: list[float] = []
        loop_cpu: list[float] = []
        calls: list[float] = []
        parts: dict[str, list[float]] = {label: [] for label, _ in PARTS}
        profiled: list[float] = []
        for i in range(args.rounds):
            t0, l0 = time.process_time(), time.thread_time()
            await round_(args.requests)
            cpu.append((time.process_time() - t0) / args.requests * 1e6)
            loop_cpu.append((time.thread_time() - l0) / args.requests * 1e6)
            profile = cProfile.Profile(time.thread_time)  # CPU, not wall time: the machine is shared
            t0 = time.process_time()
            profile.enable()
            await round_(args.requests)
            profile.disable()
            profiled.append((time.process_time() - t0) / args.requests * 1e6)
            n_calls, part = _parts(profile, args.requests)
            if args.dump:
                profile.dump_stats(args.dump)  # the last profiled round's
            calls.append(n_calls)
            for label, us in part.items():
                parts[label].append(us)
            print(f"round {i + 1}: {cpu[-1]:.0f} µs CPU per request ({loop_cpu[-1]:.0f} the event loop's thread), "
                  f"{n_calls:.0f} calls per request", flush=True)
    finally:
        if client.returncode is None:
            client.stdin.close()
            await client.wait()
        os.kill(os.getpid(), signal.SIGTERM)  # server.serve's handler: drain, stop the engine
        await serving

    def mmm(xs: list[float], fmt: str = "{:.0f}") -> str:
        return " / ".join(fmt.format(x) for x in (min(xs), statistics.median(xs), max(xs)))

    print(f"\nstand-in engine, tiny model, {args.requests} streaming chat requests per round, {args.concurrency} at a "
          f"time, max_tokens {args.max_tokens}; {args.rounds} rounds of each kind; min / median / max")
    print(f"server process CPU per request: {mmm(cpu)} µs; the event loop's thread alone: {mmm(loop_cpu)} µs")
    print(f"Python and C calls per request (cProfile, event-loop thread): {mmm(calls)}")
    print(f"CPU per request under cProfile: {mmm(profiled)} µs; by part (cumulative thread CPU, under the profiler):")
    for label, values in parts.items():
        print(f"  {label:<58} {mmm(values)} µs")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=256, help="requests per round")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of each kind (plain, profiled)")
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--port", type=int, default=0, help="default: a free port")
    ap.add_argument("--serve-args", default="", help="more `streamproxy serve` flags")
    ap.add_argument("--dump", default=None, help="write the last profiled round's cProfile stats here (pstats)")
    ap.add_argument("--client", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.client is not None:
        _client_main(args.client, args.concurrency, args.max_tokens)
        return
    from harness.process import free_port

    from .gpu import KV_CACHE_GIB
    from .standin_model import StepModel

    if not args.port:
        args.port = free_port()
    # The engine core (spawned) resolves bench.standin from this repository, with the step model's variables.
    os.environ.update(StepModel().env())  # bench-gpu's defaults
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    import uvloop

    uvloop.run(_bench(args))


if __name__ == "__main__":
    main()
