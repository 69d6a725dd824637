"""The request's tools, and the check a parsed call must pass before it is sent.

`ToolSet.check(name, arguments)`: the name is a tool and the arguments a JSON object fitting its
`parameters` schema; auto-mode parsers send only calls that pass. Validators (jsonschema, imported on
first use) are compiled once per distinct schema, keyed by a hash of its canonical JSON;
`compile_schema` raises `SchemaInvalid` (a 400 naming the tool). A `$ref` that cannot be followed fails
the check of a call, not the request.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import msgspec

from streamproxy.filters.jsonscan import loads

_CACHE_SIZE = 512
_validators: OrderedDict[bytes, Any] = OrderedDict()

EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


class SchemaInvalid(ValueError):
    pass


def schema_key(schema: Mapping[str, Any]) -> bytes:
    # msgspec, not orjson: a client's schema may hold integers past 64 bits (orjson refuses them).
    return hashlib.blake2b(msgspec.json.encode(schema, order="sorted"), digest_size=16).digest()


def compile_schema(schema: Mapping[str, Any]) -> Any:
    """A validator for `schema` (cached by hash), or SchemaInvalid saying why not."""
    key = schema_key(schema)
    validator = _validators.get(key)
    if validator is not None:
        _validators.move_to_end(key)
        return validator
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise SchemaInvalid(exc.message) from None
    except (TypeError, AttributeError):  # found by tests/fuzz: {"$schema": []} or {"$schema": 5}
        raise SchemaInvalid(f"'$schema' must be a string, got {schema.get('$schema')!r}") from None
    except RecursionError:
        raise SchemaInvalid("the schema nests too deeply") from None
    validator = cls(schema)
    _validators[key] = validator
    if len(_validators) > _CACHE_SIZE:
        _validators.popitem(last=False)
    return validator


def cached_validators() -> int:
    return len(_validators)


class ToolSet:
    """Function tools by name: {name: parameters schema}."""

    __slots__ = ("schemas", "_validators")

    def __init__(self, schemas: Mapping[str, Mapping[str, Any] | None]) -> None:
        self.schemas = {name: (schema or EMPTY_OBJECT) for name, schema in schemas.items()}
        self._validators: dict[str, Any] = {}

    def validator(self, name: str) -> Any:
        v = self._validators.get(name)
        if v is None:
            v = self._validators[name] = compile_schema(self.schemas[name])
        return v

    def check(self, name: Any, arguments: str) -> bool:
        """True when `name` is a tool and `arguments` is JSON matching its parameters."""
        if not isinstance(name, str) or name not in self.schemas:
            return False
        try:
            value = loads(arguments)
        except ValueError:
            return False
        if not isinstance(value, dict):
            return False
        try:
            return self.validator(name).is_valid(value)
        except RecursionError:  # {"$ref": "#"}: a schema that only leads back to itself
            return False
        except Exception as exc:
            from referencing.exceptions import Unresolvable  # jsonschema's own dependency

            if isinstance(exc, Unresolvable):
                # A `$ref` that leads nowhere: no call can be shown to fit, so none is claimed
                # (found by tests/fuzz; it was an exception in the middle of the stream).
                return False
            raise
