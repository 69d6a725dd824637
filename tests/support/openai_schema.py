"""Validate server output against OpenAI's published JSON Schemas.

The schemas come from `shared/openai-spec/chat-schemas.json` beside the
repository (the repository's parent folder holds `shared/`), or from the
folder named by STREAMPROXY_OPENAI_SPEC. That file holds component schemas
under `$defs` (JSON Schema 2020-12) but still uses OpenAPI 3.0's
`nullable: true`, which JSON Schema does not know: `load_defs()` rewrites
every `{..., "nullable": true}` node into `{"anyOf": [{...}, {"type": "null"}]}`
(exactly what `nullable` means, also for nodes holding an `enum` or a `$ref`).

    validate(name, instance)        raise jsonschema.ValidationError (the most relevant one)
    errors(name, instance)          every message, [] when valid, for readable assertions
    validator_with(name, edit)      a validator on a copy of the $defs changed by `edit`
                                    (to isolate one known gap and check the rest)

Depends only on `jsonschema`.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

REPO = Path(__file__).resolve().parents[2]
SPEC_DIR = Path(os.environ.get("STREAMPROXY_OPENAI_SPEC") or REPO.parent / "shared" / "openai-spec")
CHAT_SCHEMAS = SPEC_DIR / "chat-schemas.json"


def rewrite_nullable(node: Any) -> Any:
    """A copy of `node` with OpenAPI's `nullable: true` turned into JSON Schema."""
    if isinstance(node, list):
        return [rewrite_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: rewrite_nullable(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


@cache
def load_defs(path: str = str(CHAT_SCHEMAS)) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        document = json.load(f)
    return rewrite_nullable(document["$defs"])


def schema_for(name: str, defs: dict[str, Any]) -> dict[str, Any]:
    if name not in defs:
        raise KeyError(f"no schema {name!r} in {CHAT_SCHEMAS}")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": defs, "$ref": f"#/$defs/{name}"}


@cache
def validator(name: str, path: str = str(CHAT_SCHEMAS)) -> jsonschema.protocols.Validator:
    schema = schema_for(name, load_defs(path))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate(name: str, instance: Any) -> None:
    """Raise `jsonschema.ValidationError` (the most relevant one) unless `instance` fits `name`."""
    error = jsonschema.exceptions.best_match(validator(name).iter_errors(instance))
    if error is not None:
        raise error


def errors(name: str, instance: Any) -> list[str]:
    """All validation messages (empty when valid), each as `path: message`."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(name).iter_errors(instance)]


def validator_with(name: str, edit: Callable[[dict[str, Any]], None]) -> jsonschema.protocols.Validator:
    """A validator for `name` on a deep copy of the $defs changed by `edit`."""
    defs = copy.deepcopy(load_defs())
    edit(defs)
    schema = schema_for(name, defs)
    return jsonschema.validators.validator_for(schema)(schema)
