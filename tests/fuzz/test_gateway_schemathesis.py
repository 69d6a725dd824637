"""schemathesis over GET /openapi.json of a real `streamproxy gateway` in front of a `serve --engine fake`.

As tests/fuzz/test_schemathesis.py does for serve: the document is loaded
from the live gateway, every operation in it gets requests generated from
its own schema, positive and (where there is a body to break) negative,
and the same checks hold (never a 5xx, documented statuses and content
types, JSON answers that fit their schemas, negative data refused with a
4xx). Also: nothing logged at ERROR, and no traceback, by the gateway or
its replica (their log files, after each example).

The document does not name the deployments, so a generated `{deployment}`
would only ever be a 404: where the path's parameters were generated
positive, most examples name the deployment (by name or id) instead, and
most positive bodies name it as their `model` (or leave it out: the
gateway has one deployment), so the requests reach the replica.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.parameters import ParameterLocation

from harness.server import fake_server, start_gateway
from streamproxy.gateway.openapi import GATEWAY_OPERATIONS
from streamproxy.gateway.routes import DEPLOYMENT_PREFIXES
from tests.fuzz.fuzz_support import budget
from tests.fuzz.schemathesis_support import FLAGS, Document, ErrorLog

NAME, ID = "fuzz-chat", "dep-chat"
OPERATIONS = [(op.method.upper(), op.path, op.request is not None) for op in GATEWAY_OPERATIONS]
CASES = [
    pytest.param(method, path, mode, id=f"{method} {path} {mode.value}")
    for method, path, has_body in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    # Negative data needs a body to break; the `/v1/deployments/{deployment}/v1/...` form is the
    # handler of the form without the second /v1 (its negative data would only repeat that one's).
    if mode == GenerationMode.POSITIVE or (has_body and not path.startswith(DEPLOYMENT_PREFIXES[1]))
]


class Gateway(Document):
    def __init__(self, base: str, log: ErrorLog) -> None:
        super().__init__(base)
        self.log = log


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    logs = tmp_path_factory.mktemp("gateway-schemathesis")
    with fake_server(*FLAGS, log_dir=logs) as replica:
        config = {"deployments": [{"name": NAME, "id": ID, "served_model": "fake", "upstreams": [replica]}]}
        gateway = start_gateway(config, logs, flags=["--access-log", "off"])
        try:
            server = Gateway(gateway.base, ErrorLog(logs))
            yield server
            server.session.close()
        finally:
            gateway.stop()


def test_every_route_is_an_operation(live):
    found = {(op.ok().method.upper(), op.ok().path) for op in live.schema.get_all_operations()}
    # schemathesis leaves out the operation that serves the document itself.
    assert found | {("GET", "/openapi.json")} == {(method, path) for method, path, _ in OPERATIONS}


def _positive(case, location: ParameterLocation) -> bool:
    component = case.meta.components.get(location)
    return component is not None and component.mode == GenerationMode.POSITIVE


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
@budget(3)
@given(data=st.data())
def test_operation(live, method, path, mode, data):
    case = live.case(data, method, path, mode)
    if "deployment" in (case.path_parameters or {}) and _positive(case, ParameterLocation.PATH):
        case.path_parameters["deployment"] = data.draw(st.sampled_from([NAME, ID, NAME, ID, case.path_parameters["deployment"]]))
    if isinstance(case.body, dict) and _positive(case, ParameterLocation.BODY):
        model = data.draw(st.sampled_from([NAME, ID, None, "keep"]))
        if model is None:
            case.body.pop("model", None)
        elif model != "keep":
            case.body["model"] = model
    event(str(live.call(case, mode)))
    assert live.log.new() == [], f"logged for {case.method} {case.formatted_path} {case.body!r:.2000}"
