"""Helpers for the HTTP tests: `created` normalisation and the OpenAI error check.

SSE parsing, schema validation and waiting are in tests/support (shared by
every folder); these two are the HTTP tests' own.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from tests.support.openai_schema import validate

CREATED_RE = re.compile(rb'"created":(\d+)')


def normalize_created(body: bytes) -> tuple[bytes, set[int]]:
    """Replace every `"created":<n>` with `"created":0`; return the body and the values seen."""
    seen = {int(m) for m in CREATED_RE.findall(body)}
    return CREATED_RE.sub(b'"created":0', body), seen


def assert_created_sane(values: set[int]) -> None:
    """All chunks share one `created`, and it is 'now' (Unix seconds)."""
    assert len(values) == 1, values
    (value,) = values
    assert abs(value - time.time()) < 60, value


def assert_openai_error(
    status: int,
    headers: Any,
    body: bytes,
    *,
    expect_status: int,
    type: str | None = None,
    param: Any = ...,
    code: Any = ...,
) -> dict[str, Any]:
    """The exact OpenAI error shape, the right status, an X-Request-Id, no traceback."""
    assert status == expect_status, (status, body)
    assert status != 500 or expect_status == 500
    assert headers["Content-Type"].split(";")[0].strip() == "application/json", headers.get("Content-Type")
    assert headers.get("X-Request-Id"), "error responses must carry X-Request-Id"
    assert b"Traceback" not in body and b'File "' not in body, body
    data = json.loads(body)
    assert list(data) == ["error"], data
    err = data["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err
    validate("ErrorResponse", data)
    if type is not None:
        assert err["type"] == type, err
    if param is not ...:
        assert err["param"] == param, err
    if code is not ...:
        assert err["code"] == code, err
    return err
