"""A Responses API request -> the equivalent chat request (then the chat path does the rest).

Pure functions. `to_chat(req)`: `instructions` -> a first system message; message items -> messages of
their role; `function_call` -> tool calls on the assistant message they follow; `function_call_output`
-> tool messages; `reasoning` -> the next assistant message's `reasoning_content`. What needs stored
state (`previous_response_id`, `conversation`, `item_reference`, stored `prompt`s) is a 400 asking for
the conversation in `input`. Errors name the Responses field; `CHAT_NAMES` renames the chat path's.
"""

from __future__ import annotations

from typing import Any

from streamproxy.apis.responses.protocol import InputContent, InputItem, ResponsesRequest
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

# chat parameter -> Responses parameter, for errors raised by the chat path.
CHAT_NAMES: list[tuple[str, str]] = [
    ("reasoning_effort", "reasoning.effort"),
    (".function.parameters", ".parameters"),
    (".function.name", ".name"),
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_tokens", "max_output_tokens"),
    ("messages", "input"),
]

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_MEDIA_PARTS = ("input_image", "input_file", "input_audio", "image_url", "file")
_ROLES = ("user", "assistant", "system", "developer")


def _stateless(field: str, what: str) -> InvalidRequest:
    return InvalidRequest(
        f"'{field}' is not supported: this server does not store {what}. "
        "Send the whole conversation in 'input' instead ('store' only keeps a response for GET /v1/responses/{id}).",
        param=field,
    )


def check_supported(req: ResponsesRequest) -> None:
    if req.previous_response_id is not None:
        raise _stateless("previous_response_id", "responses")
    if req.conversation is not None:
        raise _stateless("conversation", "conversations")
    if req.prompt is not None:
        raise _stateless("prompt", "prompt templates")
    if req.background and req.store is False:
        raise InvalidRequest("background can only be used when `store` is true", param="background")  # vLLM's
    if req.top_logprobs:
        raise InvalidRequest("'top_logprobs' is not supported on /v1/responses yet", param="top_logprobs")
    if req.input is None:
        raise InvalidRequest("missing required parameter 'input'", param="input", code="missing_required_parameter")


def _text(parts: str | list[InputContent] | None, where: str) -> str:
    if parts is None or isinstance(parts, str):
        return parts or ""
    texts: list[str] = []
    for j, part in enumerate(parts):
        if part.type in _TEXT_PARTS:
            if part.text is None:
                raise InvalidRequest(f"a '{part.type}' part needs 'text'", param=f"{where}[{j}].text")
            texts.append(part.text)
        elif part.type == "refusal":
            texts.append(part.refusal or part.text or "")
        elif part.type in _MEDIA_PARTS:
            raise InvalidRequest(f"the served model is text-only and cannot take '{part.type}' content", param=f"{where}[{j}].type")
        else:
            raise InvalidRequest(f"unknown content part type '{part.type}'", param=f"{where}[{j}].type")
    return "\n".join(texts)


class _Conversation:
    """Builds the chat messages, attaching calls and reasoning to their assistant message."""

    def __init__(self) -> None:
        self.messages: list[ChatMessage] = []
        self.assistant: ChatMessage | None = None  # the one function_calls may still join
        self.reasoning: list[str] = []

    def add(self, message: ChatMessage) -> None:
        if message.role == "assistant" and self.reasoning:
            message.reasoning = "\n".join(self.reasoning)
            self.reasoning = []
        self.messages.append(message)
        self.assistant = message if message.role == "assistant" else None

    def call(self, item: InputItem, where: str) -> None:
        if not item.call_id or not item.name:
            missing = "call_id" if not item.call_id else "name"
            raise InvalidRequest(f"a function_call item needs '{missing}'", param=f"{where}.{missing}")
        call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments or "{}"))
        if self.assistant is None:
            self.add(ChatMessage(role="assistant", content=None, tool_calls=[]))
        assert self.assistant is not None
        if self.assistant.tool_calls is None:
            self.assistant.tool_calls = []
        self.assistant.tool_calls.append(call)


def messages(req: ResponsesRequest) -> list[ChatMessage]:
    conv = _Conversation()
    if req.instructions:
        conv.add(ChatMessage(role="system", content=req.instructions))
    items = req.input
    if isinstance(items, str):
        conv.add(ChatMessage(role="user", content=items))
        return conv.messages
    for i, item in enumerate(items or ()):
        where = f"input[{i}]"
        kind = item.type
        if kind == "message":
            if item.role not in _ROLES:
                raise InvalidRequest(f"invalid role '{item.role}': expected user, assistant, system or developer", param=f"{where}.role")
            role = "system" if item.role == "developer" else item.role
            conv.add(ChatMessage(role=role, content=_text(item.content, f"{where}.content")))
        elif kind == "function_call":
            conv.call(item, where)
        elif kind == "function_call_output":
            if not item.call_id:
                raise InvalidRequest("a function_call_output item needs 'call_id'", param=f"{where}.call_id")
            conv.add(ChatMessage(role="tool", tool_call_id=item.call_id, content=_text(item.output, f"{where}.output")))
        elif kind == "reasoning":
            text = _text(item.content, f"{where}.content") or _text(item.summary, f"{where}.summary")
            if text:
                conv.reasoning.append(text)
        elif kind == "item_reference":
            raise _stateless(f"{where}", "items (item_reference)")
        else:
            raise InvalidRequest(f"unsupported input item type '{kind}'", param=f"{where}.type")
    if not conv.messages:
        raise InvalidRequest("'input' must contain at least one message", param="input")
    return conv.messages


def _tools(req: ResponsesRequest) -> list[Tool] | None:
    if req.tools is None:
        return None
    out: list[Tool] = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function":
            raise InvalidRequest(f"unsupported tool type '{tool.type}': only 'function' tools are supported", param=f"tools[{i}].type")
        if not tool.name:
            raise InvalidRequest("a function tool needs a 'name'", param=f"tools[{i}].name")
        out.append(Tool(function=FunctionDefinition(name=tool.name, description=tool.description, parameters=tool.parameters, strict=tool.strict)))
    return out


def _tool_choice(req: ResponsesRequest) -> str | NamedToolChoice | None:
    choice = req.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    if choice.type != "function":
        raise InvalidRequest(f"unsupported tool_choice type '{choice.type}': expected a function", param="tool_choice.type")
    if not choice.name:
        raise InvalidRequest("tool_choice of type 'function' needs a 'name'", param="tool_choice.name")
    return NamedToolChoice(function=NamedFunction(name=choice.name))


def _response_format(req: ResponsesRequest) -> ResponseFormat | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_schema":
        if fmt.schema is None:
            raise InvalidRequest("text.format of type 'json_schema' needs 'schema'", param="text.format.schema")
        schema = JsonSchemaFormat(name=fmt.name or "response", schema=fmt.schema, strict=fmt.strict, description=fmt.description)
        return ResponseFormat(type="json_schema", json_schema=schema)
    return ResponseFormat(type=fmt.type)  # json_object, or a type the chat path refuses by name


def to_chat(req: ResponsesRequest) -> ChatCompletionRequest:
    check_supported(req)
    extra: dict[str, Any] = {}
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort is not None:
        extra["reasoning_effort"] = effort  # thinking on ("none": off), see params.template_kwargs
    return ChatCompletionRequest(
        messages=messages(req),
        model=req.model,
        stream=req.stream,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        seed=req.seed,
        user=req.user,
        tools=_tools(req),
        tool_choice=_tool_choice(req),
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=_response_format(req),
        **extra,
    )
