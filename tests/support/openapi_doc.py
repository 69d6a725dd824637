"""Checks of an OpenAPI document that serve's and the gateway's /openapi.json tests share.

    app_routes(app)                 (method, path) of every route an aiohttp app registers (HEAD aside)
    assert_valid_3_1(doc, path)     valid OpenAPI 3.1, and the validator does reject the same document
                                    with `path`'s first parameter made optional (else it says nothing)
    assert_refs_closed(doc, text)   every $ref resolves, every component is referenced
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError


def app_routes(app: Any) -> set[tuple[str, str]]:
    out = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        info = route.resource.get_info()
        path = info.get("path") or info["formatter"]
        out.add((route.method.lower(), path))
    return out


def assert_valid_3_1(doc: dict[str, Any], path_with_parameter: str) -> None:
    assert doc["openapi"] == "3.1.0"
    validate(doc, cls=OpenAPIV31SpecValidator)
    broken = copy.deepcopy(doc)
    (operation,) = broken["paths"][path_with_parameter].values()
    operation["parameters"][0]["required"] = False  # a path parameter must be required
    with pytest.raises(OpenAPIValidationError):
        validate(broken, cls=OpenAPIV31SpecValidator)


def assert_refs_closed(doc: dict[str, Any], text: str) -> None:
    components = doc["components"]["schemas"]
    for name in components:
        assert f'"#/components/schemas/{name}"' in text, f"{name} is never referenced"
    for ref in re.findall(r'"#/components/schemas/([^"]+)"', text):
        assert ref in components, ref
