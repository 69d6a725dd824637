"""`--tool-call-parser auto` and `--reasoning-parser auto`: the parser a model needs, read from
its chat template (and its config's `model_type`), once, when the engine has loaded.

A chat template that teaches the model a tool-call syntax names it in its own text: Hermes and
Qwen wrap calls in `<tool_call>`, Mistral writes `[TOOL_CALLS]`, Llama 3.1-3.3 put JSON after
`<|python_tag|>` (or are told `"parameters": dictionary of argument name ...`), Llama 3.2's
light models and Llama 4 write Python calls (`[func_name1(params_name1=...`). Thinking models
open `<think>`: Qwen3's template (model type qwen3*) as `qwen3`, the others as DeepSeek-R1
does. Where no marker is found the answer is None and the server keeps its behaviour without
a parser (`required` and named tool choice work; `auto` is a 400 that says why). Sans-IO.
"""

from __future__ import annotations

# (what the template says, the parser), first match wins: the more specific markers first.
TOOL_MARKERS: tuple[tuple[str, str], ...] = (
    ("[TOOL_CALLS]", "mistral"),
    ("<tool_call>", "hermes"),
    ("[func_name1(", "pythonic"),
    ("<|python_tag|>", "llama3_json"),
    ('"parameters": dictionary of argument name', "llama3_json"),
)
THINK_MARKER = "<think>"
AUTO = "auto"


def tool_parser_for(template: str | None, model_type: str | None = None) -> str | None:
    """The tool-call parser the chat template's syntax needs, or None."""
    if not template:
        return None
    for marker, parser in TOOL_MARKERS:
        if marker in template:
            return parser
    return None


def reasoning_parser_for(template: str | None, model_type: str | None = None) -> str | None:
    """The reasoning parser for a template that opens `<think>`, or None."""
    if not template or THINK_MARKER not in template:
        return None
    return "qwen3" if (model_type or "").startswith("qwen3") else "deepseek_r1"


def resolve(tool_parser: str | None, reasoning_parser: str | None, template: str | None, model_type: str | None) -> tuple[str | None, str | None]:
    """The flags' parsers with `auto` replaced by what the template shows (None: nothing found)."""
    if tool_parser == AUTO:
        tool_parser = tool_parser_for(template, model_type)
    if reasoning_parser == AUTO:
        reasoning_parser = reasoning_parser_for(template, model_type)
    return tool_parser, reasoning_parser
