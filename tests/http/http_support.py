"""Helpers for the HTTP tests: SSE splitting, OpenAI error checks, schema validation.

Kept in a module (not only in conftest) so tests can import plain functions.
The JSON Schemas come from /work/shared/openai-spec/chat-schemas.json; that
file still uses OpenAPI-3.0 `nullable: true`, which JSON Schema 2020-12 does
not know, so every schema carrying it is rewritten to
`{"anyOf": [<schema without nullable>, {"type": "null"}]}` before validating
(this works for `type`, `enum` and `$ref` schemas alike).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

SPEC_PATH = Path("/work/shared/openai-spec/chat-schemas.json")

DONE = b"data: [DONE]\n\n"

USER_HI = [{"role": "user", "content": "hi"}]
# FakeEngine's chat template renders [user "hi"] as "<|user|>hi\n<|assistant|>",
# one token per character.
USER_HI_PROMPT_TOKENS = len("<|user|>hi\n<|assistant|>")
CREATED_RE = re.compile(rb'"created":(\d+)')


# -- waiting -----------------------------------------------------------------


async def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.005) -> bool:
    """Poll `predicate` until it is true or `timeout` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        await asyncio.sleep(interval)


# -- SSE ------------------------------------------------------------------------


def sse_frames(body: bytes) -> list[bytes]:
    """Split an SSE body into its frames (without the blank-line terminator).

    Asserts the framing itself: the body ends with a blank line and every frame
    is a single `data: ` line (this server never sends multi-line events).
    """
    assert body.endswith(b"\n\n"), body[-80:]
    frames = body[:-2].split(b"\n\n")
    for f in frames:
        assert f.startswith(b"data: ") or f.startswith(b":"), f
        assert b"\n" not in f, f
    return frames


def sse_payloads(body: bytes) -> list[Any]:
    """Decoded JSON of each `data:` frame before `[DONE]`; asserts [DONE] is last and unique."""
    frames = [f for f in sse_frames(body) if not f.startswith(b":")]
    assert frames[-1] == b"data: [DONE]", frames[-1]
    assert frames.count(b"data: [DONE]") == 1
    return [json.loads(f[len(b"data: ") :]) for f in frames[:-1]]


def normalize_created(body: bytes) -> tuple[bytes, set[int]]:
    """Replace every `"created":<n>` with `"created":0`; return the body and the values seen."""
    seen = {int(m) for m in CREATED_RE.findall(body)}
    return CREATED_RE.sub(b'"created":0', body), seen


def assert_created_sane(values: set[int]) -> None:
    """All chunks share one `created`, and it is 'now' (Unix seconds)."""
    assert len(values) == 1, values
    (value,) = values
    assert abs(value - time.time()) < 60, value


# -- errors ----------------------------------------------------------------------


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


# -- JSON Schema -------------------------------------------------------------------


def _allow_null(node: Any) -> Any:
    if isinstance(node, list):
        return [_allow_null(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _allow_null(v) for k, v in node.items()}
    if out.get("nullable") is True:
        del out["nullable"]
        return {"anyOf": [out, {"type": "null"}]}
    out.pop("nullable", None)
    return out


@lru_cache(maxsize=1)
def spec_defs() -> dict[str, Any]:
    spec = json.loads(SPEC_PATH.read_text())
    return _allow_null(spec["$defs"])


def schema_for(name: str, defs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": defs if defs is not None else spec_defs(),
        "$ref": f"#/$defs/{name}",
    }


@lru_cache(maxsize=None)
def _validator(name: str) -> jsonschema.protocols.Validator:
    schema = schema_for(name)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate(name: str, instance: Any) -> None:
    """Raise jsonschema.ValidationError unless `instance` matches OpenAI's `name` schema."""
    _validator(name).validate(instance)


def validator_with(name: str, edit: Callable[[dict[str, Any]], None]) -> jsonschema.protocols.Validator:
    """A validator for `name` on a deep copy of the $defs changed by `edit` (to isolate a known gap)."""
    defs = copy.deepcopy(spec_defs())
    edit(defs)
    schema = schema_for(name, defs)
    return jsonschema.validators.validator_for(schema)(schema)
