"""schemathesis over GET /openapi.json of a real `streamproxy serve --engine fake`.

The document is loaded from the live server (so what is served is what is
fuzzed), and every operation in it gets requests generated from its own
schema: positive (data that fits the schema) and, where there is a body or a
body to break, negative (data that does not). Checks: never a 5xx,
the status and content type are ones the document lists, a JSON answer fits
its schema, (negative) data outside the schema is refused with a 4xx, and the
server logs no ERROR line or traceback for the request.
schemathesis 4's Python API: `openapi.from_url`, `APIOperation.as_strategy`,
`Case.call`, `Case.validate_response`; the budget and seed come from the
hypothesis profile (tests/fuzz/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from schemathesis import GenerationMode

from harness.server import fake_server
from streamproxy.http import openapi
from tests.fuzz.fuzz_support import budget
from tests.fuzz.schemathesis_support import FLAGS, Document, ErrorLog

# The operations, known at collection from the same document the server builds.
OPERATIONS = [(op.method.upper(), op.path) for op in openapi.OPERATIONS]


_WITH_BODY = {(op.method.upper(), op.path) for op in openapi.OPERATIONS if op.request is not None}


def _breakable(method: str, path: str) -> bool:
    """Negative data needs something to break: a body (a string path parameter cannot be broken;
    POST /ping and /invocations document none)."""
    return (method, path) in _WITH_BODY


CASES = [
    pytest.param(method, path, mode, id=f"{method} {path} {mode.value}")
    for method, path in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode == GenerationMode.POSITIVE or _breakable(method, path)
]


class Served(Document):
    def __init__(self, base: str, log: ErrorLog) -> None:
        super().__init__(base)
        self.log = log


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    logs = tmp_path_factory.mktemp("serve-schemathesis")
    with fake_server(*FLAGS, log_dir=logs) as base:
        server = Served(base, ErrorLog(logs))
        yield server
        server.session.close()


def test_every_route_is_an_operation(live):
    found = {(op.ok().method.upper(), op.ok().path) for op in live.schema.get_all_operations()}
    # schemathesis leaves out the operation that serves the document itself.
    assert found | {("GET", "/openapi.json")} == set(OPERATIONS)


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
@budget(6)
@given(data=st.data())
def test_operation(live, method, path, mode, data):
    case = live.case(data, method, path, mode)
    live.call(case, mode)
    assert live.log.new() == [], f"logged for {case.method} {case.formatted_path} {case.body!r:.2000}"
