"""Client timeouts and the connection cap, the nginx way (http/connection.py).

Half the headers then silence, or a body that stops short of its
Content-Length: 408 with an error body, then a close. A connection that says
nothing, or stays idle between requests: closed without a word. Past
`max_connections`: new connections closed at once, the others served. Each
close is counted in /metrics; after a slowloris storm the server's
descriptors, tasks and engine requests are back where they were.

Timeouts here are short (tenths of a second); only lower bounds and generous
upper bounds ("well before the default of 60 s") are checked on time.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time

import psutil
from prometheus_client import REGISTRY

from engine_adapter.fake import FakeScript
from harness.server import FAKE_ARGS, serve_process
from tests.production.raw_http import chat_body, http_request
from tests.support import wait_until

SHORT = 0.3
EARLIEST = SHORT - 0.01  # uvloop's (libuv's) timers count whole milliseconds
BOUND = 20.0  # far under the defaults (60 s, 75 s): a close within it is ours, not a default's


def closed(reason: str) -> float:
    return REGISTRY.get_sample_value("streamproxy_connections_closed_total", {"reason": reason}) or 0.0


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    async with asyncio.timeout(BOUND):
        return await reader.read()


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def openai_error(body: bytes) -> dict:
    data = json.loads(body)
    assert list(data) == ["error"] and set(data["error"]) == {"message", "type", "param", "code"}, data
    return data["error"]


async def test_half_the_headers_then_silence_is_408_then_close(server, access_log):
    srv = await server(client_header_timeout=SHORT)
    before = closed("header_timeout")
    started = time.monotonic()  # before the connect: the server may accept before the client's connect returns
    reader, writer = await connect(srv.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
    raw = await until_closed(reader)
    assert time.monotonic() - started >= EARLIEST
    writer.close()
    status, headers, body = parse(raw)
    assert raw.startswith(b"HTTP/1.0 408 ") and status == 408, raw  # HTTP/1.0, as every answer to an unread request: no keep-alive
    assert headers["content-type"].startswith("application/json")
    err = openai_error(body)
    assert err["code"] == "request_timeout" and err["type"] == "invalid_request_error"
    assert "--client-header-timeout" in err["message"]
    assert closed("header_timeout") == before + 1
    assert srv.engine.submitted == []
    assert any('"status":408' in line for line in access_log)


async def test_a_connection_that_sends_nothing_is_closed_without_a_word(server):
    srv = await server(client_header_timeout=SHORT)
    before = closed("header_timeout")
    started = time.monotonic()
    reader, writer = await connect(srv.port)
    assert await until_closed(reader) == b""
    assert time.monotonic() - started >= EARLIEST
    writer.close()
    assert closed("header_timeout") == before + 1


async def test_a_body_short_of_its_content_length_is_408_then_close(server):
    srv = await server(client_body_timeout=SHORT)
    before = closed("body_timeout")
    reader, writer = await connect(srv.port)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    started = time.monotonic()
    writer.write(head + b'{"me')
    raw = await until_closed(reader)
    assert time.monotonic() - started >= EARLIEST
    writer.close()
    status, headers, body = parse(raw)
    assert status == 408 and headers["connection"] == "close", raw
    err = openai_error(body)
    assert err["code"] == "request_timeout" and "--client-body-timeout" in err["message"]
    assert closed("body_timeout") == before + 1
    assert srv.engine.submitted == []


async def test_the_body_408_is_in_the_routes_own_error_shape(server):
    srv = await server(client_body_timeout=SHORT)
    reader, writer = await connect(srv.port)
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    status, _, body = parse(await until_closed(reader))
    writer.close()
    assert status == 408
    data = json.loads(body)
    assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error", data


async def test_the_body_timeout_is_between_reads_not_for_the_whole_body(server):
    # A body trickling in (a read every 0.05 s, ten times under the timeout) for twice the timeout.
    srv = await server(client_body_timeout=0.5)
    body = chat_body(max_tokens=3)
    reader, writer = await connect(srv.port)
    head = http_request("POST", "/v1/chat/completions", body)[: -len(body)]
    writer.write(head)
    started = time.monotonic()
    for byte in range(len(body)):
        writer.write(body[byte : byte + 1])
        await writer.drain()
        if time.monotonic() - started < 1.0:
            await asyncio.sleep(0.05)
    assert time.monotonic() - started >= 1.0
    head_raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND)
    writer.close()
    assert head_raw.startswith(b"HTTP/1.1 200 "), head_raw


async def test_idle_keepalive_connection_is_closed_after_keepalive_timeout(server):
    srv = await server(keepalive_timeout=SHORT, client_header_timeout=BOUND * 3)
    before = closed("keepalive_timeout")
    reader, writer = await connect(srv.port)
    idle_from = time.monotonic()  # no later than the server's response
    writer.write(http_request("GET", "/v1/models"))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND)
    status, headers, _ = parse(head)
    assert status == 200 and headers.get("connection") != "close"
    await reader.readexactly(int(headers["content-length"]))
    assert await until_closed(reader) == b""  # quietly: no 408 to a client that asked for nothing
    assert time.monotonic() - idle_from >= EARLIEST
    writer.close()
    assert closed("keepalive_timeout") == before + 1


async def test_a_kept_alive_connection_gets_the_header_timeout_from_its_next_first_byte(server):
    srv = await server(keepalive_timeout=BOUND * 3, client_header_timeout=SHORT)
    before = closed("header_timeout"), closed("keepalive_timeout")
    reader, writer = await connect(srv.port)
    writer.write(http_request("GET", "/v1/models"))
    status, headers, _ = parse(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND))
    await reader.readexactly(int(headers["content-length"]))
    assert status == 200
    writer.write(b"GET /v1/models HTTP/1.1\r\nHos")
    status, _, body = parse(await until_closed(reader))
    writer.close()
    assert status == 408 and openai_error(body)["code"] == "request_timeout"
    assert (closed("header_timeout"), closed("keepalive_timeout")) == (before[0] + 1, before[1])


async def test_once_a_request_begins_the_header_timeout_applies_not_the_keepalive_timeout(server):
    """aiohttp's idle timer (keepalive_timeout) runs between requests only: on a fresh connection
    and from a kept-alive connection's first byte the header timeout applies, even when it is the
    longer one (nginx's client_header_timeout), and a close then is a header timeout's 408."""
    srv = await server(keepalive_timeout=SHORT, client_header_timeout=SHORT * 3)
    before = closed("header_timeout"), closed("keepalive_timeout")
    started = time.monotonic()
    reader, writer = await connect(srv.port)
    writer.write(b"GET /v1/mo")  # fresh: past the keep-alive timeout, well within the header timeout
    await asyncio.sleep(SHORT * 1.5)
    writer.write(b"dels HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    status, headers, _ = parse(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND))
    await reader.readexactly(int(headers["content-length"]))
    assert status == 200 and time.monotonic() - started >= SHORT * 1.5
    writer.write(b"GET /v1/models HTTP/1.1\r\nHos")  # the next request begins at once, then stalls
    idle_from = time.monotonic()
    status, _, body = parse(await until_closed(reader))
    writer.close()
    assert status == 408 and openai_error(body)["code"] == "request_timeout"
    assert time.monotonic() - idle_from >= SHORT * 3 - 0.01
    assert (closed("header_timeout"), closed("keepalive_timeout")) == (before[0] + 1, before[1])


async def test_keepalive_timeout_zero_closes_after_each_response(server):
    srv = await server(keepalive_timeout=0)
    before = closed("keepalive_timeout")
    reader, writer = await connect(srv.port)
    writer.write(http_request("GET", "/v1/models"))
    status, headers, _ = parse(await until_closed(reader))
    writer.close()
    assert status == 200 and headers["connection"] == "close"
    assert await wait_until(lambda: srv.runner.server.open_connections == 0, BOUND)
    assert closed("keepalive_timeout") == before  # closed as the response said, not for idling


async def test_timeouts_do_not_touch_a_request_being_answered(server):
    # A stream far longer than every timeout: the timers belong to reading a request, and to idling.
    script = FakeScript(tokens=["a"] * 12, token_delay=0.1)
    srv = await server(script, client_header_timeout=SHORT, client_body_timeout=SHORT, keepalive_timeout=SHORT)
    reader, writer = await connect(srv.port)
    writer.write(http_request("POST", "/v1/chat/completions", chat_body(stream=True)))
    raw = await until_closed(reader)  # the stream ends, then the idle connection is closed
    writer.close()
    assert raw.startswith(b"HTTP/1.1 200 ")
    body = raw.partition(b"\r\n\r\n")[2]
    assert b"data: [DONE]" in body and body.count(b'"content":"a"') == 12, body[-400:]


async def test_past_max_connections_new_ones_are_closed_at_once_and_the_others_served(server):
    srv = await server(max_connections=3)
    before = closed("over_limit")
    held = [await connect(srv.port) for _ in range(3)]
    assert await wait_until(lambda: srv.runner.server.open_connections == 3, BOUND)
    reader, writer = await connect(srv.port)
    assert await until_closed(reader) == b""  # at once: the header timeout is 60 s
    writer.close()
    assert closed("over_limit") == before + 1
    for r, w in held:
        w.write(http_request("GET", "/v1/models"))
        status, _ = parse(await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), BOUND))[:2]
        assert status == 200
    # One goes: room for one more.
    held[0][1].close()
    assert await wait_until(lambda: srv.runner.server.open_connections == 2, BOUND)
    reader, writer = await connect(srv.port)
    writer.write(http_request("GET", "/v1/models", headers={"Connection": "close"}))
    status = parse(await until_closed(reader))[0]
    assert status == 200
    for _, w in [*held[1:], (reader, writer)]:
        w.close()
    assert await wait_until(lambda: srv.runner.server.open_connections == 0, BOUND)


async def test_a_slowloris_storm_leaves_nothing_behind(server):
    # One second, not SHORT: the honest clients' headers must get in while 200 others connect.
    srv = await server(FakeScript(tokens=["x"] * 5, token_delay=0.02), client_header_timeout=1.0, client_body_timeout=1.0)
    me = psutil.Process()
    # Warm up (first request's lazy imports and caches), then the baseline.
    reader, writer = await connect(srv.port)
    writer.write(http_request("POST", "/v1/chat/completions", chat_body(), {"Connection": "close"}))
    assert (await until_closed(reader)).startswith(b"HTTP/1.1 200 ")
    writer.close()
    await writer.wait_closed()
    assert await wait_until(lambda: srv.runner.server.open_connections == 0, BOUND)
    fds, tasks, running = me.num_fds(), len(asyncio.all_tasks()), srv.engine.num_running
    before = closed("header_timeout"), closed("body_timeout")

    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    openings = [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: 1", head + b'{"me']

    async def slow(kind: int) -> bytes:
        reader, writer = await connect(srv.port)
        try:
            writer.write(openings[kind])
            return await until_closed(reader)
        finally:
            writer.close()
            await writer.wait_closed()

    async def honest() -> bytes:
        reader, writer = await connect(srv.port)
        try:
            writer.write(http_request("POST", "/v1/chat/completions", chat_body(stream=True), {"Connection": "close"}))
            return await until_closed(reader)
        finally:
            writer.close()
            await writer.wait_closed()

    storm = [slow(i % 3) for i in range(201)]
    results = await asyncio.gather(*storm, *(honest() for _ in range(10)))
    slow_answers, honest_answers = results[:201], results[201:]
    # Served meanwhile; the slow ones answered as their kind deserves.
    assert all(a.startswith(b"HTTP/1.1 200 ") and b"data: [DONE]" in a for a in honest_answers)
    assert slow_answers[0::3] == [b""] * 67
    assert all(parse(a)[0] == 408 for a in slow_answers[1::3] + slow_answers[2::3])
    assert (closed("header_timeout"), closed("body_timeout")) == (before[0] + 134, before[1] + 67)
    # Back where it was: descriptors, tasks, engine requests, connections.
    assert await wait_until(
        lambda: me.num_fds() <= fds and len(asyncio.all_tasks()) <= tasks and srv.runner.server.open_connections == 0, BOUND
    ), (me.num_fds(), fds, len(asyncio.all_tasks()), tasks, srv.runner.server.open_connections)
    assert srv.engine.num_running == running == 0


async def _scrape(port: int) -> str:
    reader, writer = await connect(port)
    writer.write(http_request("GET", "/metrics", headers={"Connection": "close"}))
    raw = await until_closed(reader)
    writer.close()
    assert raw.startswith(b"HTTP/1.1 200 "), raw[:200]
    return raw.partition(b"\r\n\r\n")[2].decode()


def _sample(text: str, name: str, labels: str = "") -> float:
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_streamproxy_serve_as_a_new_user_runs_it(tmp_path):
    """The flags and a STREAMPROXY_* variable reach a real `streamproxy serve`: its cap and timeouts
    hold against a storm, and its open descriptors (/proc/<pid>/fd) come back to where they were."""
    # Two seconds: the probes below must all run while the 40 are still held.
    flags = [*FAKE_ARGS, "--client-header-timeout", "2", "--max-connections", "40"]
    with serve_process(flags, log_dir=tmp_path, env={"STREAMPROXY_CLIENT_BODY_TIMEOUT": "2"}) as proc:
        fd_dir = f"/proc/{proc.proc.pid}/fd"
        text = await _scrape(proc.port)
        fds = len(os.listdir(fd_dir))
        reasons = ("header_timeout", "body_timeout", "over_limit")
        before = {r: _sample(text, "streamproxy_connections_closed_total", f'{{reason="{r}"}}') for r in reasons}

        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"
        held = []
        for i in range(40):  # the cap: 30 half headers, 10 stalled bodies
            reader, writer = await connect(proc.port)
            writer.write(b"GET /v1/models HTTP/1.1\r\nHo" if i < 30 else head + b"{")
            held.append((reader, writer))

        async def probe() -> bool:
            """A full request on a new connection: answered (room left), or closed unanswered (the cap)."""
            reader, writer = await connect(proc.port)
            writer.write(http_request("GET", "/health", headers={"Connection": "close"}))
            try:
                return await until_closed(reader) == b""
            except ConnectionResetError:
                return True
            finally:
                writer.close()

        refused = 0
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            if await probe():
                refused += 1
                break
        assert refused == 1, "the 41st connection was never refused"
        refused += sum([await probe() for _ in range(19)])
        assert refused == 20  # every one past the cap, at once (the header timeout would answer after 2 s)
        answers = [await until_closed(r) for r, _ in held]
        for _, w in held:
            w.close()
        assert all(parse(a)[0] == 408 for a in answers), [a[:40] for a in answers]

        text = await _scrape(proc.port)
        after = {r: _sample(text, "streamproxy_connections_closed_total", f'{{reason="{r}"}}') for r in reasons}
        assert {r: after[r] - before[r] for r in reasons} == {"header_timeout": 30, "body_timeout": 10, "over_limit": 20}
        assert _sample(text, "streamproxy_open_connections") == 1  # the scrape's own
        assert _sample(text, "streamproxy_engine_requests") == 0
        assert await wait_until(lambda: len(os.listdir(fd_dir)) <= fds, BOUND), (os.listdir(fd_dir), fds)
