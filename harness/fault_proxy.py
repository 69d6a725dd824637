"""A TCP proxy in front of one replica that turns faulty on SIGUSR1 (bench/failover.py's variants).

    python -m harness.fault_proxy --port P --target T --fault reset|stall|error

Until the signal it relays bytes both ways (the replica's /health too). On SIGUSR1, once:

  - reset: every connection is closed with a TCP reset (SO_LINGER 0) on both sides, and every
    connection after it too: a replica whose connections reset;
  - stall: nothing more goes to the client on any connection, none is closed (the replica's
    side is closed when the client's is); later connections are read and never answered:
    a replica that stops sending without closing;
  - error: every response whose chunked body is under way gets at once (the proxy relays whole
    chunks, so it is always between two) vLLM's in-band engine error event (`{"error": {...,
    "code": 500}}`), `[DONE]` and the last chunk, then both sides are closed; later requests are
    relayed as before: an engine error in-band, sent when the fault happens, as vLLM sends it when
    its engine core dies, not with the replica's next token (a replica pausing would add its pause).

Responses are followed as HTTP/1.1 (head, then a chunked body chunk by chunk, or Content-Length
bytes) in `error` and `stall` mode: the error must go in at a chunk boundary, and both count the
responses under way. It prints one line per fault (`faulted N connections`: reset, every
connection; stall and error, those with a chunked body under way) to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import struct
import sys

ERROR_EVENT = (b'data: {"error":{"message":"EngineCore encountered an issue (injected by harness.fault_proxy)",'
               b'"type":"InternalServerError","param":null,"code":500}}\n\n')
DONE_EVENT = b"data: [DONE]\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class _Conn:
    __slots__ = ("client", "replica", "in_body", "ended")

    def __init__(self, client: asyncio.StreamWriter, replica: asyncio.StreamWriter) -> None:
        self.client, self.replica = client, replica
        self.in_body = False  # error and stall mode: a chunked body is under way
        self.ended = False  # error mode: it was under way at the fault, and ended with the error


class FaultProxy:
    def __init__(self, target: int, fault: str) -> None:
        self.target, self.fault = target, fault
        self.faulted = False
        self.conns: set[_Conn] = set()
        self.stalled = False  # stall mode: the fault happened

    def trigger(self) -> None:
        if self.faulted:
            return
        self.faulted = True
        n = 0
        if self.fault == "reset":
            for c in list(self.conns):
                _reset(c.client)
                _reset(c.replica)
                n += 1
        elif self.fault == "stall":
            self.stalled = True
            n = sum(c.in_body for c in self.conns)
        else:
            for c in list(self.conns):
                if c.in_body:
                    c.ended = True
                    c.client.write(_chunk(ERROR_EVENT) + _chunk(DONE_EVENT) + b"0\r\n\r\n")
                    _reset(c.replica)  # the request ends on the replica
                    c.client.close()  # (after the buffered bytes)
                    n += 1
        print(f"faulted {n} connections ({self.fault})", flush=True)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.faulted and self.fault == "reset":
            _reset(writer)
            return
        if self.faulted and self.fault == "stall":
            while await reader.read(65536):
                pass
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            _reset(writer)
            return
        conn = _Conn(writer, up_writer)
        self.conns.add(conn)
        down = self._raw(conn, up_reader) if self.fault == "reset" else self._chunked(conn, up_reader)
        try:
            await asyncio.gather(self._up(conn, reader), down)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self.conns.discard(conn)
            writer.close()
            up_writer.close()

    async def _up(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        while data := await reader.read(65536):
            conn.replica.write(data)
            await conn.replica.drain()
        conn.replica.close()  # the client went away: so does the request on the replica
        conn.client.close()

    async def _raw(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        while data := await reader.read(65536):
            conn.client.write(data)
            await conn.client.drain()
        conn.client.close()

    async def _send(self, conn: _Conn, data: bytes) -> None:
        if self.stalled:
            return  # dropped: never again a byte to the client, until its side closes (`_up`)
        conn.client.write(data)
        await conn.client.drain()

    async def _chunked(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        client = conn.client
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            if conn.ended:
                return
            lower = head.lower()
            if b"transfer-encoding: chunked" not in lower:
                length = 0
                for line in lower.split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await self._send(conn, head + (await reader.readexactly(length) if length else b""))
                continue
            await self._send(conn, head)
            conn.in_body = True
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0], 16)
                data = await reader.readexactly(size + 2)  # the chunk and its CRLF
                if conn.ended:
                    return
                await self._send(conn, size_line + data)
                if size == 0:
                    break
            conn.in_body = False
        if not self.stalled:
            client.close()


async def main(port: int, target: int, fault: str) -> None:
    proxy = FaultProxy(target, fault)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, proxy.trigger)
    server = await asyncio.start_server(proxy.serve, "127.0.0.1", port, backlog=1024)
    print(f"fault proxy on 127.0.0.1:{port} -> 127.0.0.1:{target} ({fault})", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m harness.fault_proxy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")  # (harness.server.command_line's words; 127.0.0.1 only)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--target", type=int, required=True, help="the replica's port on 127.0.0.1")
    ap.add_argument("--fault", choices=("reset", "stall", "error"), required=True)
    a = ap.parse_args()
    try:
        asyncio.run(main(a.port, a.target, a.fault))
    except KeyboardInterrupt:
        sys.exit(0)
