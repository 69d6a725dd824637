"""An Anthropic Messages request -> the equivalent chat request (then the chat path does the rest).

Pure functions. `to_chat(req)`: `system` -> a first system message; user text -> user messages,
`tool_result` -> tool messages in block order; assistant text/`tool_use` -> one assistant message with
tool calls; `thinking` -> its `reasoning_content` (redacted_thinking dropped). Client `tools` and
`tool_choice` become chat tools (server tools refused by name), `output_config.format` a JSON Schema
response_format, `stop_sequences` stop strings kept in the output (stopseq.py), and `thinking` /
`output_config.effort` the template's `enable_thinking` or `reasoning_effort`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from streamproxy.apis.anthropic.protocol import Block, CountTokensRequest, MessagesRequest
from streamproxy.errors import InvalidRequest
from streamproxy.protocol.common import JsonSchemaFormat, ResponseFormat
from streamproxy.protocol.openai_chat import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    Tool,
    ToolCall,
)

# chat parameter -> Anthropic parameter, for errors raised by the chat path.
CHAT_NAMES: list[tuple[str, str]] = [
    ("reasoning_effort", "output_config.effort"),
    (".function.parameters", ".input_schema"),
    (".function.name", ".name"),
    ("response_format.json_schema.schema", "output_config.format.schema"),
    ("response_format", "output_config.format"),
    ("stop", "stop_sequences"),
]

_MEDIA = ("image", "document", "search_result", "container_upload")


def _texts(blocks: list[Block], where: str, allowed: tuple[str, ...] = ("text",)) -> str:
    out: list[str] = []
    for j, b in enumerate(blocks):
        if b.type not in allowed:
            raise _block_error(b, f"{where}[{j}]")
        out.append(b.text or "")
    return "\n".join(out)


def _block_error(block: Block, where: str) -> InvalidRequest:
    if block.type in _MEDIA:
        return InvalidRequest(f"the served model is text-only and cannot take '{block.type}' blocks", param=f"{where}.type")
    return InvalidRequest(f"a '{block.type}' block is not allowed here", param=f"{where}.type")


def _tool_result(block: Block, where: str) -> ChatMessage:
    if not block.tool_use_id:
        raise InvalidRequest("a tool_result block needs 'tool_use_id'", param=f"{where}.tool_use_id")
    content = block.content
    text = content if isinstance(content, str) else _texts(content or [], f"{where}.content")
    return ChatMessage(role="tool", tool_call_id=block.tool_use_id, content=text)


def _user(blocks: list[Block], where: str, out: list[ChatMessage]) -> None:
    texts: list[str] = []
    for j, b in enumerate(blocks):
        if b.type == "tool_result":
            if texts:
                out.append(ChatMessage(role="user", content="\n".join(texts)))
                texts = []
            out.append(_tool_result(b, f"{where}[{j}]"))
        elif b.type == "text":
            texts.append(b.text or "")
        else:
            raise _block_error(b, f"{where}[{j}]")
    if texts:
        out.append(ChatMessage(role="user", content="\n".join(texts)))


def _assistant(blocks: list[Block], where: str) -> ChatMessage:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    for j, b in enumerate(blocks):
        if b.type == "text":
            texts.append(b.text or "")
        elif b.type == "tool_use":
            if not b.id or not b.name:
                missing = "id" if not b.id else "name"
                raise InvalidRequest(f"a tool_use block needs '{missing}'", param=f"{where}[{j}].{missing}")
            # msgspec, not orjson: `input` may hold integers past 64 bits (orjson refuses them).
            arguments = msgspec.json.encode(b.input if b.input is not None else {}).decode()
            calls.append(ToolCall(id=b.id, function=FunctionCall(name=b.name, arguments=arguments)))
        elif b.type == "thinking":
            thinking.append(b.thinking or "")
        elif b.type == "redacted_thinking":
            continue
        else:
            raise _block_error(b, f"{where}[{j}]")
    return ChatMessage(
        role="assistant",
        content="".join(texts) if texts or not calls else None,
        tool_calls=calls or None,
        reasoning="\n".join(thinking) if thinking else None,
    )


def messages(req: CountTokensRequest) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    system = req.system
    if system:
        text = system if isinstance(system, str) else "\n".join(b.text or "" for b in system if b.type == "text")
        if text:
            out.append(ChatMessage(role="system", content=text))
    if not req.messages:
        raise InvalidRequest("'messages' must contain at least one message", param="messages")
    for i, m in enumerate(req.messages):
        where = f"messages[{i}].content"
        if m.role not in ("user", "assistant"):
            raise InvalidRequest(f"invalid role '{m.role}': expected user or assistant", param=f"messages[{i}].role")
        if isinstance(m.content, str):
            out.append(ChatMessage(role=m.role, content=m.content))
        elif m.role == "user":
            _user(m.content, where, out)
        else:
            out.append(_assistant(m.content, where))
    return out


def _tools(req: CountTokensRequest) -> list[Tool] | None:
    if req.tools is None:
        return None
    out: list[Tool] = []
    for i, tool in enumerate(req.tools):
        if tool.type not in (None, "custom"):
            raise InvalidRequest(f"unsupported tool type '{tool.type}': only client tools (with input_schema) are supported", param=f"tools[{i}].type")
        out.append(Tool(function=FunctionDefinition(name=tool.name, description=tool.description, parameters=tool.input_schema)))
    return out


def _tool_choice(req: CountTokensRequest) -> tuple[str | NamedToolChoice | None, bool | None]:
    choice = req.tool_choice
    if choice is None:
        return None, None
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type in ("auto", "none"):
        return choice.type, parallel
    if choice.type == "any":
        return "required", parallel
    if choice.type == "tool":
        if not choice.name:
            raise InvalidRequest("tool_choice of type 'tool' needs a 'name'", param="tool_choice.name")
        return NamedToolChoice(function=NamedFunction(name=choice.name)), parallel
    raise InvalidRequest(f"invalid tool_choice type '{choice.type}': expected auto, any, tool or none", param="tool_choice.type")


def _response_format(req: CountTokensRequest) -> ResponseFormat | None:
    fmt = req.output_config.format if req.output_config is not None else None
    if fmt is None:
        return None
    if fmt.type != "json_schema" or fmt.schema is None:
        raise InvalidRequest("output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}", param="output_config.format")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(schema=fmt.schema))


def _reasoning(req: CountTokensRequest) -> dict[str, Any]:
    """thinking / output_config.effort -> the chat request's reasoning fields."""
    out: dict[str, Any] = {}
    thinking = req.thinking
    effort = req.output_config.effort if req.output_config is not None else None
    if thinking is not None and thinking.type == "disabled":
        out["chat_template_kwargs"] = {"enable_thinking": False}
    elif effort is not None or thinking is not None:
        out["reasoning_effort"] = effort or "medium"
    return out


def to_chat(req: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request; for a count_tokens request only what shapes the prompt is set."""
    choice, parallel = _tool_choice(req)
    chat: dict[str, Any] = {
        "messages": messages(req),
        "model": req.model,
        "tools": _tools(req),
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
        "response_format": _response_format(req),
        **_reasoning(req),
    }
    if isinstance(req, MessagesRequest):
        chat.update(
            stream=req.stream,
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            stop=req.stop_sequences or None,
            include_stop_str_in_output=bool(req.stop_sequences),  # stopseq.py strips it and names it
            user=req.metadata.user_id if req.metadata is not None else None,
        )
    return ChatCompletionRequest(**chat)
