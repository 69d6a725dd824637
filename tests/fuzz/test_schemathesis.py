"""schemathesis over GET /openapi.json of a real `streamproxy serve --engine fake`.

The document is loaded from the live server (so what is served is what is
fuzzed), and every operation in it gets requests generated from its own
schema: positive (data that fits the schema) and, where there is a body or a
body to break, negative (data that does not). Checks: never a 5xx,
the status and content type are ones the document lists, a JSON answer fits
its schema, and (negative) data outside the schema is refused with a 4xx.
schemathesis 4's Python API: `openapi.from_url`, `APIOperation.as_strategy`,
`Case.call`, `Case.validate_response`; the budget and seed come from the
hypothesis profile (tests/fuzz/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
import schemathesis
from hypothesis import given
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from streamproxy.http import openapi
from tests.fuzz.fuzz_support import budget
from tests.support.server import fake_server

FLAGS = (
    "--fake-text", "Hi there. ", "--fake-max-model-len", "512",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

# The operations, known at collection from the same document the server builds.
OPERATIONS = [(op.method.upper(), op.path) for op in openapi.OPERATIONS]


def _breakable(method: str, path: str) -> bool:
    """Negative data needs something to break: a body (a string path parameter cannot be broken)."""
    return method == "POST"


CASES = [
    pytest.param(method, path, mode, id=f"{method} {path} {mode.value}")
    for method, path in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode == GenerationMode.POSITIVE or _breakable(method, path)
]


class Live:
    def __init__(self, base: str) -> None:
        self.base = base
        self.schema = schemathesis.openapi.from_url(base + "/openapi.json")
        self.session = requests.Session()


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with fake_server(*FLAGS) as base:
        server = Live(base)
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
    operation = live.schema[path][method]
    case = data.draw(operation.as_strategy(generation_mode=mode))
    response = case.call(base_url=live.base, session=live.session, timeout=60)
    checks = CHECKS + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])
    case.validate_response(response, checks=checks)
