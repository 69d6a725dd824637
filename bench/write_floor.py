"""The floor under "server CPU per streamed chunk": one loopback TCP write per chunk, and nothing else.

    python -m bench.write_floor [-c 256] [--frames 128] [--size 120]

A reader process opens N TCP connections to this process over 127.0.0.1 and
drains them; this process then sends each connection one `size`-byte frame
per step, `frames` steps, as a streaming server does with one token per engine
step (one `socket.send` per connection per step, from a plain Python loop, no
event loop, no HTTP). It prints the sender's CPU (user + system, from
getrusage) per frame. On loopback the kernel charges the sender for most of
the receive side as well (softirq delivery, waking the reader), so this is
the least a server can spend per chunk when each chunk is its own write.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import selectors
import socket
import time
from multiprocessing.synchronize import Event as EventType


def _reader(port: int, n: int, ready: EventType) -> None:
    sel = selectors.DefaultSelector()
    socks = {s.fileno(): s for s in (socket.create_connection(("127.0.0.1", port)) for _ in range(n))}
    for s in socks.values():
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    ready.set()
    open_ = n
    while open_:
        for key, _ in sel.select():
            try:
                data = socks[key.fd].recv(65536)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fileobj)
                socks[key.fd].close()
                open_ -= 1


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(n: int, frames: int, size: int, step_interval: float, transport_mode: bool = False) -> tuple[float, float]:
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", 0))
    lst.listen(4096)
    ready = mp.Event()
    proc = mp.Process(target=_reader, args=(lst.getsockname()[1], n, ready), daemon=True)
    proc.start()
    conns = []
    for _ in range(n):
        c, _ = lst.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append(c)
    ready.wait()
    frame = b"x" * size
    if transport_mode:
        return _measure_uvloop(conns, proc, frames, frame, step_interval)
    sys0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = cpu()
    for _ in range(frames):
        for c in conns:
            c.send(frame)
        if step_interval:
            time.sleep(step_interval)
    t1 = cpu()
    sys1 = resource.getrusage(resource.RUSAGE_SELF)
    for c in conns:
        c.close()
    proc.join(10)
    total = n * frames
    return (t1 - t0) / total * 1e6, (sys1.ru_stime - sys0.ru_stime) / total * 1e6


def _measure_uvloop(conns: list, proc, frames: int, frame: bytes, step_interval: float) -> tuple[float, float]:
    """The same writes through uvloop transports (`transport.write`), one step per loop iteration."""
    import asyncio

    import uvloop

    async def run() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        transports = []
        for c in conns:
            c.setblocking(False)
            t, _ = await loop.connect_accepted_socket(asyncio.Protocol, c)
            transports.append(t)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(frames):
            for t in transports:
                t.write(bytes(frame))
            await asyncio.sleep(step_interval)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        for t in transports:
            t.close()
        total = len(transports) * frames
        return ((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / total * 1e6,
                (r1.ru_stime - r0.ru_stime) / total * 1e6)

    result = uvloop.run(run())
    proc.join(10)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--connections", default="1,64,256,1024")
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--size", type=int, default=120, help="bytes per frame (a chat chunk with its chunked-encoding framing is ~110-200)")
    ap.add_argument("--step-interval", type=float, default=0.0, help="sleep between steps (0: back to back)")
    ap.add_argument("--uvloop", action="store_true", help="write through uvloop transports instead of socket.send")
    args = ap.parse_args()
    print("| connections | sender CPU µs per frame | of which kernel |")
    print("|---:|---:|---:|")
    for n in (int(x) for x in args.connections.split(",")):
        frames = args.frames if n > 1 else args.frames * 64
        total, kernel = measure(n, frames, args.size, args.step_interval, args.uvloop)
        print(f"| {n} | {total:.2f} | {kernel:.2f} |", flush=True)


if __name__ == "__main__":
    main()
