"""Request -> tool plan and structured-output constraint (the params layer for both).

Pure functions; a bad field raises `InvalidRequest` naming it. `tool_plan` reads `tools`, `tool_choice`
(default "auto" with tools) and `parallel_tool_calls` into a `ToolPlan` of mode "none" (plain text),
"auto" (the model's own syntax; needs --enable-auto-tool-choice --tool-call-parser, else a 400),
"required" or "named" (constrained decoding with the JSON Schema vLLM builds, `$defs` hoisted).
`constraint` gives `GenerationParams.structured`: the tool schema, else `response_format` or vLLM's
`structured_outputs`/`guided_*` (more than one: 400). Schemas are checked against the meta-schema
first (cached by hash in `filters.toolset`), so a broken one is a 400 that says why.
"""

from __future__ import annotations

from typing import Any

import msgspec

from streamproxy.errors import InvalidRequest
from streamproxy.filters.toolset import EMPTY_OBJECT, SchemaInvalid, compile_schema
from streamproxy.protocol.openai_chat import ChatCompletionRequest, NamedToolChoice
from streamproxy.protocol.openai_completions import CompletionRequest

# The constraint kinds of vLLM's StructuredOutputsParams, and its options.
_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")


class ToolPlan:
    __slots__ = ("mode", "tools", "schemas", "name", "parallel", "constraint")

    def __init__(self, mode: str, tools: list[dict[str, Any]], schemas: dict[str, dict[str, Any]], *, name: str | None = None, parallel: bool = True) -> None:
        self.mode = mode
        self.tools = tools  # as the chat template wants them
        self.schemas = schemas  # name -> parameters schema
        self.name = name
        self.parallel = parallel
        self.constraint: dict[str, Any] | None = None


def _check_schema(schema: Any, param: str) -> None:
    if not isinstance(schema, dict):
        raise InvalidRequest("a JSON Schema must be an object", param=param)
    try:
        compile_schema(schema)
    except SchemaInvalid as exc:
        raise InvalidRequest(f"invalid JSON Schema: {exc}", param=param) from None


def tool_plan(req: ChatCompletionRequest, *, auto_parser: str | None, no_parser: str | None = None) -> ToolPlan | None:
    tools = req.tools or []
    choice = req.tool_choice
    if not tools:
        if choice is None or choice in ("none", "auto"):
            return None
        raise InvalidRequest("'tool_choice' needs 'tools'", param="tool_choice")
    schemas: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        if tool.type != "function":
            raise InvalidRequest(f"unsupported tool type '{tool.type}': only 'function' tools are supported", param=f"tools[{i}].type")
        name = tool.function.name
        if not name:
            raise InvalidRequest("a function needs a name", param=f"tools[{i}].function.name")
        if name in schemas:
            raise InvalidRequest(f"two tools are named '{name}'", param=f"tools[{i}].function.name")
        params = tool.function.parameters
        if params is not None:
            _check_schema(params, f"tools[{i}].function.parameters")
        schemas[name] = params or EMPTY_OBJECT
    as_dicts = msgspec.to_builtins(tools)
    parallel = req.parallel_tool_calls is not False
    if choice is None:
        choice = "auto"
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in schemas:
            raise InvalidRequest(f"tool_choice names '{name}', which is not in 'tools'", param="tool_choice.function.name")
        plan = ToolPlan("named", as_dicts, schemas, name=name, parallel=parallel)
        plan.constraint = {"json": schemas[name]}
        return plan
    if choice == "none":
        return ToolPlan("none", as_dicts, schemas, parallel=parallel)
    if choice == "required":
        plan = ToolPlan("required", as_dicts, schemas, parallel=parallel)
        plan.constraint = {"json": _calls_schema(schemas, parallel)}
        return plan
    if choice == "auto":
        if auto_parser is None:
            raise InvalidRequest(
                no_parser
                or "\"auto\" tool choice requires the server to be started with --enable-auto-tool-choice "
                "and --tool-call-parser NAME (or auto, for a model whose chat template shows its tool-call syntax); "
                "send tool_choice \"required\", a named function or \"none\" instead",
                param="tool_choice",
            )
        return ToolPlan("auto", as_dicts, schemas, parallel=parallel)
    raise InvalidRequest(f"invalid tool_choice '{choice}': expected none, auto, required or a named function", param="tool_choice")


def _calls_schema(schemas: dict[str, dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """[{"name": <one of the tools>, "parameters": <its schema>}, ...], as vLLM constrains it."""
    defs: dict[str, Any] = {}
    variants = []
    for name, params in schemas.items():
        if "$defs" in params:
            params = dict(params)
            for key, value in params.pop("$defs").items():
                if defs.setdefault(key, value) != value:
                    raise InvalidRequest(f"tools define '$defs/{key}' differently", param="tools")
        variants.append(
            {
                "properties": {"name": {"type": "string", "enum": [name]}, "parameters": params},
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def constraint(req: ChatCompletionRequest | CompletionRequest, plan: ToolPlan | None = None) -> dict[str, Any] | None:
    if plan is not None and plan.constraint is not None:
        return plan.constraint
    found: list[tuple[str, dict[str, Any]]] = []
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_object":
            found.append(("response_format", {"json_object": True}))
        elif fmt.type == "json_schema":
            if fmt.json_schema is None or fmt.json_schema.schema is None:
                raise InvalidRequest("response_format json_schema needs 'json_schema.schema'", param="response_format.json_schema")
            _check_schema(fmt.json_schema.schema, "response_format.json_schema.schema")
            found.append(("response_format", {"json": fmt.json_schema.schema}))
        else:
            raise InvalidRequest(
                f"unsupported response_format type '{fmt.type}': expected text, json_object or json_schema",
                param="response_format.type",
            )
    if req.structured_outputs:
        so = req.structured_outputs
        unknown = sorted(set(so) - set(_KINDS) - set(_OPTIONS))
        if unknown:
            raise InvalidRequest(f"unknown structured_outputs field '{unknown[0]}'", param=f"structured_outputs.{unknown[0]}")
        kinds = [k for k in _KINDS if so.get(k) is not None]
        if len(kinds) != 1:
            raise InvalidRequest("structured_outputs needs exactly one of: " + ", ".join(_KINDS), param="structured_outputs")
        if isinstance(so.get("json"), dict):
            _check_schema(so["json"], "structured_outputs.json")
        found.append(("structured_outputs", {k: v for k, v in so.items() if v is not None}))
    for field, kind in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"), ("guided_grammar", "grammar")):
        value = getattr(req, field)
        if value is not None:
            if kind == "json" and isinstance(value, dict):
                _check_schema(value, field)
            found.append((field, {kind: value}))
    if len(found) > 1:
        raise InvalidRequest(
            f"only one structured-output constraint may be given, got {found[0][0]} and {found[1][0]}", param=found[1][0]
        )
    return found[0][1] if found else None
