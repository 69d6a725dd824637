"""The fake engine's chat template: each message as `<|role|>content` and a newline, the tools first as
sorted compact JSON, `<|assistant|>` for a generation prompt; a template given by the server or the
request is rendered with Jinja (sandboxed), as a real one. Returns the text; the engine encodes it."""

from __future__ import annotations

import json
from typing import Any

import jinja2.sandbox


def _text(content: Any) -> str:
    """A message's content as the fake template shows it: a string, or the texts of a list of parts."""
    if isinstance(content, list):
        return "\n".join(str(part.get("text") or "") for part in content)
    return content or ""


def render(
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    continue_final_message: bool,
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None,
    chat_template: str | None,
) -> str:
    if chat_template is not None:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment()
        return env.from_string(chat_template).render(
            messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **(chat_template_kwargs or {})
        )
    parts = [f"<|{m['role']}|>{_text(m.get('content'))}\n" for m in messages]
    if tools:
        parts.insert(0, "<|tools|>" + json.dumps(tools, sort_keys=True, separators=(",", ":")) + "\n")
    if add_generation_prompt and not continue_final_message:
        parts.append("<|assistant|>")
    return "".join(parts)
