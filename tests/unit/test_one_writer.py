"""One writer of a client's socket (streamproxy/http/body.py), read from the source with `ast`.

Every byte the product writes to a client's transport itself (stream frames pushed from the
engine's step, the gateway's relayed events, keepalives, the 408 to an unread request), and
every look at how much is still unsent there (flow control), is `body.py`'s; everything else
goes through aiohttp's response (`Body.write`/`finish` call it). Reaching for a transport's
`write`, `writelines` or `get_write_buffer_size` anywhere else, also by keeping the bound method
in a name, fails here. The one exception is the gateway's HTTP client (`gateway/exchange.py`'s
connections, pooled by wire.py): it writes requests to replicas on connections of its own, not a
client's response.
(tests/production/test_one_writer.py and tests/gateway/test_one_writer.py check the same at
run time: every write to a stream's transport comes through body.py.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WRITER = "streamproxy/http/body.py"
# Writes to connections that are not a client's: the gateway's own client to its replicas.
CLIENT_SIDE = {"streamproxy/gateway/exchange.py"}


def transport_writes(source: str) -> list[tuple[int, str]]:
    """Each `<...transport...>.write`/`.writelines` (called or not) and each `get_write_buffer_size` in `source`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr == "get_write_buffer_size" or (node.attr in ("write", "writelines") and "transport" in ast.unparse(node.value)):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def product() -> list[Path]:
    return sorted(p for folder in ("streamproxy", "engine_adapter") for p in (ROOT / folder).rglob("*.py"))


def test_the_reader_sees_calls_aliases_and_buffer_reads() -> None:
    source = (
        "def f(request, t):\n"
        "    request.transport.write(b'x')\n"
        "    w = self.transport.writelines\n"
        "    if t.get_write_buffer_size() > 0: pass\n"
        "    response.write(b'y')\n"  # aiohttp's response: not the transport
        "    log.write('z')\n"
    )
    assert [text for _, text in transport_writes(source)] == [
        "request.transport.write", "self.transport.writelines", "t.get_write_buffer_size",
    ]


@pytest.mark.parametrize("path", product(), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_body_writes_to_a_transport(path: Path) -> None:
    where = path.relative_to(ROOT).as_posix()
    if where == WRITER or where in CLIENT_SIDE:
        return
    found = transport_writes(path.read_text())
    assert found == [], f"{where} writes to a transport or reads its buffer itself (only {WRITER} may): {found}"


def test_the_body_is_where_the_writes_are() -> None:
    """The rule is not vacuous: the writer module does write, push, relay and beat."""
    texts = [text for _, text in transport_writes((ROOT / WRITER).read_text())]
    assert texts.count("transport.write") >= 4 and "transport.get_write_buffer_size" in texts
