"""Where a streamed chunk's Python CPU goes, measured in-process, layer by layer, without sockets.

    python -m bench.chunk_cost [-c 256,1024] [--steps 200] [--rounds 5]

N fake-engine chat streams are set up as the server runs them in push mode
(a `DeltaQueue` armed with the writer's sink, a `ChatStreamEncoder` per
stream), then the engine is stepped by hand. The same steps are timed with
more and more of the chunk path switched on, so each difference is one part:

1. engine: the fake engine's step (one `Delta` per stream) and
   `DeltaQueue.put` calling a sink that only returns True;
2. + encoder: the sink runs `encoder.step` (the chunk's bytes);
3. + writer: the real sink (`body.StreamBody.push`): chunked-encoding framing, the
   `transport.write` call into a transport that drops the bytes, and the
   per-write bookkeeping (heartbeat deadline, inter-token latency).

What it leaves out is what needs the socket: the write syscall (the write
floor, bench/write_floor.py), the event loop's own work, and the per-request
cost (HTTP, admission, role/usage/[DONE] frames, access log) amortised over
the request's chunks; `make bench-fake` measures the whole. Medians of
`--rounds` rounds, µs of CPU (process time) per chunk.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

from aiohttp import web

from engine_adapter.base import Delta, DeltaQueue, GenerationParams
from engine_adapter.fake import FakeEngine, FakeScript
from streamproxy.core.stream import ChatStreamEncoder
from streamproxy.http.body import StreamBody


class NullTransport:
    """Takes writes and drops them; never behind, never closing."""

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        pass


def _encoder(i: int) -> ChatStreamEncoder:
    return ChatStreamEncoder(response_id=f"chatcmpl-{i:032x}", created=1_700_000_000, model="fake", n=1,
                             include_usage=True, system_fingerprint="fp_streamproxy")


def _body(out: DeltaQueue, transport: NullTransport) -> StreamBody:
    """The server's body of one stream, on a transport that drops the bytes (no heartbeat)."""
    request = cast(web.BaseRequest, SimpleNamespace(transport=transport))
    body = StreamBody(request, web.StreamResponse(), _encoder(0), heartbeat=None, stall=0.0)
    body.out = out
    return body


def _sink(layer: str, out: DeltaQueue, transport: NullTransport) -> Callable[[list[Delta]], bool]:
    if layer == "engine":
        return lambda deltas: True
    if layer == "encoder":
        step = _encoder(0).step
        return lambda deltas: bool(step(deltas)) or True
    body = _body(out, transport)
    return cast(Callable[[list[Delta]], bool], body.push)


async def _round(layer: str, streams: int, steps: int) -> float:
    engine = FakeEngine(FakeScript(token_delay=3600.0), record=False)
    await engine.start()  # its step loop sleeps: steps are made by hand below
    try:
        params = GenerationParams(max_tokens=steps + 2, ignore_eos=True)
        transport = NullTransport()
        outs: list[Any] = []
        for i in range(streams):
            out = await engine.generate(f"r{i}", [1, 2, 3], params)
            outs.append(out)
            out.arm(_sink(layer, out, transport))
        engine.step(time.monotonic())  # the first step outside the clock
        gc.collect()
        gc.freeze()
        t0 = time.process_time()
        for _ in range(steps):
            engine.step(time.monotonic())
        t1 = time.process_time()
        gc.unfreeze()
        if any(o.get_nowait() for o in outs):
            raise RuntimeError("a sink refused a step: the figures would not be the push path")
        return (t1 - t0) / (steps * streams) * 1e6
    finally:
        await engine.close()


LAYERS = ("engine", "encoder", "writer")


def measure(streams: int, steps: int, rounds: int) -> dict[str, float]:
    import uvloop

    out: dict[str, float] = {}
    for layer in LAYERS:
        out[layer] = statistics.median(uvloop.run(_round(layer, streams, steps)) for _ in range(rounds))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--streams", default="256,1024")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print("| streams | engine step + put µs | encoder µs | writer (framing, write call, bookkeeping) µs | total µs |")
    print("|---:|---:|---:|---:|---:|")
    for n in (int(x) for x in args.streams.split(",")):
        m = measure(n, args.steps, args.rounds)
        print(f"| {n} | {m['engine']:.2f} | {m['encoder'] - m['engine']:.2f} | {m['writer'] - m['encoder']:.2f} "
              f"| {m['writer']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
