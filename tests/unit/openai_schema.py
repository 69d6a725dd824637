"""Validate server output against OpenAI's published JSON Schemas.

`/work/shared/openai-spec/chat-schemas.json` holds component schemas under
`$defs` (JSON Schema 2020-12), but still uses OpenAPI 3.0's `nullable: true`.
`load_defs()` rewrites every `{..., "nullable": true}` node into
`{"anyOf": [{...}, {"type": "null"}]}` (which is exactly what `nullable`
means, also for nodes that hold an `enum` or a `$ref`), and `validate(name,
instance)` checks an instance against `$defs[name]`.

Import it as `tests.unit.openai_schema` (or relatively, `from .openai_schema
import validate`), or copy it: it depends only on `jsonschema`.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

SPEC_DIR = Path(os.environ.get("STREAMPROXY_OPENAI_SPEC", "/work/shared/openai-spec"))
CHAT_SCHEMAS = SPEC_DIR / "chat-schemas.json"


def rewrite_nullable(node: Any) -> Any:
    """Return a copy of `node` with OpenAPI `nullable: true` turned into JSON Schema."""
    if isinstance(node, list):
        return [rewrite_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: rewrite_nullable(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


@lru_cache(maxsize=None)
def load_defs(path: str = str(CHAT_SCHEMAS)) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        document = json.load(f)
    return rewrite_nullable(document["$defs"])


@lru_cache(maxsize=None)
def validator(name: str, path: str = str(CHAT_SCHEMAS)) -> jsonschema.protocols.Validator:
    defs = load_defs(path)
    if name not in defs:
        raise KeyError(f"no schema {name!r} in {path}")
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": defs, "$ref": f"#/$defs/{name}"}
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate(name: str, instance: Any) -> None:
    """Raise `jsonschema.ValidationError` (the most relevant one) if `instance` does not fit."""
    error = jsonschema.exceptions.best_match(validator(name).iter_errors(instance))
    if error is not None:
        raise error


def errors(name: str, instance: Any) -> list[str]:
    """All validation messages (empty when valid), for readable assertions."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(name).iter_errors(instance)]
