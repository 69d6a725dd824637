"""`--tool-call-parser auto` / `--reasoning-parser auto`: the parser read from a chat template.

The templates are the distinctive lines of real ones (Qwen2.5/Hermes, Mistral, Llama 3.1,
Llama 3.2, Llama 3.2 light's pythonic prompt, Qwen3, DeepSeek-R1, SmolLM2's plain ChatML)."""

from __future__ import annotations

import pytest

from streamproxy.filters.detect import reasoning_parser_for, resolve, tool_parser_for

QWEN25 = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags"
)
MISTRAL = "{%- if message.tool_calls %}{{- '[TOOL_CALLS] [' }}{%- for tool_call in message.tool_calls %}"
LLAMA31 = "{%- if builtin_tools is defined %}{{- '<|python_tag|>' + tool_call.name + '.call(' }}"
LLAMA32 = (
    '{{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}'
    "{{- 'Do not use variables.\\n\\n' }}"
)
PYTHONIC = "You SHOULD NOT include any other text in the response if you call a function\\n[func_name1(params_name1=params_value1, params_name2=params_value2...)]"
QWEN3 = QWEN25 + "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
R1 = "{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"
CHATML = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"


@pytest.mark.parametrize(
    "template, parser",
    [(QWEN25, "hermes"), (QWEN3, "hermes"), (MISTRAL, "mistral"), (LLAMA31, "llama3_json"), (LLAMA32, "llama3_json"),
     (PYTHONIC, "pythonic"), (R1, None), (CHATML, None), (None, None), ("", None)],
)
def test_the_tool_parser_is_the_syntax_the_template_teaches(template, parser):
    assert tool_parser_for(template) == parser


@pytest.mark.parametrize(
    "template, model_type, parser",
    [(QWEN3, "qwen3", "qwen3"), (QWEN3, "qwen3_moe", "qwen3"), (R1, "deepseek_v3", "deepseek_r1"), (R1, None, "deepseek_r1"),
     (QWEN25, "qwen2", None), (CHATML, "llama", None), (None, "qwen3", None)],
)
def test_the_reasoning_parser_is_for_templates_that_think(template, model_type, parser):
    assert reasoning_parser_for(template, model_type) == parser


def test_resolve_replaces_auto_only():
    assert resolve("auto", "auto", QWEN3, "qwen3") == ("hermes", "qwen3")
    assert resolve("mistral", "deepseek_r1", QWEN3, "qwen3") == ("mistral", "deepseek_r1")
    assert resolve("auto", None, CHATML, "llama") == (None, None)
