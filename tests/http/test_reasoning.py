"""Reasoning models end to end on the fake engine: chat, Responses, Anthropic, real clients.

The fake engine is scripted to think, then answer (or call a tool), as
Qwen3 and DeepSeek-R1 write it; the server runs with --reasoning-parser.
The thinking must arrive as `reasoning` (+ `reasoning_content`) on chat,
as a reasoning item on Responses and a thinking block on Anthropic, and
never inside the content. Chat chunks and answers are validated against
OpenAI's schemas; Responses and Anthropic events against the SDKs' models.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from anthropic.types import MessageParam, ThinkingBlock
from anthropic.types.message_create_params import MessageCreateParamsBase
from openai.types.responses import ResponseOutputMessage, ResponseReasoningItem

from engine_adapter.fake import FakeScript
from harness.server import fake_server
from tests.http.http_support import assert_openai_error
from tests.support import USER_HI, sse, validate
from tests.support.api_events import anthropic_order, check_anthropic, check_responses, responses_order
from tests.support.sse import named_events

QWEN = ["<think>", "\nThe user", " says hi", ".\n", "</think>", "\n\n", "Hello", " there!"]
THOUGHT, ANSWER = "\nThe user says hi.\n", "\n\nHello there!"
R1 = ["Hmm", ", a greeting", ".", "</think>", "Hi!"]  # the template opened <think>: the model never writes it
HI: list[MessageParam] = [{"role": "user", "content": "hi"}]  # USER_HI for Anthropic's SDK
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
}


async def chat(client, **body):
    r = await client.post("/v1/chat/completions", json={"messages": USER_HI, **body})
    return r, await r.read()


def stream_parts(body: bytes) -> tuple[str, str, list[dict], list[dict]]:
    """(reasoning, content, reasoning deltas, payloads) of a chat stream; every chunk schema-valid."""
    payloads = sse.payloads(body)
    for p in payloads:
        validate("CreateChatCompletionStreamResponse", p)
    ds = [p["choices"][0]["delta"] for p in payloads if p["choices"]]
    thinking = [d for d in ds if "reasoning" in d]
    return "".join(d["reasoning"] for d in thinking), "".join(d.get("content") or "" for d in ds), thinking, payloads


# -- chat --------------------------------------------------------------------------------------


async def test_chat_nonstream_and_stream_split_the_thinking(serve):
    client, _ = await serve(FakeScript(tokens=[*QWEN]), reasoning_parser="qwen3")
    r, body = await chat(client)
    assert r.status == 200
    data = json.loads(body)
    validate("CreateChatCompletionResponse", data)
    message = data["choices"][0]["message"]
    assert message == {"role": "assistant", "content": ANSWER, "refusal": None, "reasoning": THOUGHT, "reasoning_content": THOUGHT}
    assert data["usage"]["completion_tokens"] == len(QWEN)
    assert data["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}

    r, body = await chat(client, stream=True, stream_options={"include_usage": True})
    thought, answer, thinking, payloads = stream_parts(body)
    assert (thought, answer) == (THOUGHT, ANSWER)
    assert all(d["reasoning_content"] == d["reasoning"] for d in thinking)
    assert b"<think>" not in body and b"</think>" not in body
    assert payloads[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}


async def test_deepseek_r1_starts_inside_the_thinking(serve):
    client, _ = await serve(FakeScript(tokens=[*R1]), reasoning_parser="deepseek_r1")
    data = json.loads((await chat(client))[1])
    message = data["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("Hmm, a greeting.", "Hi!")
    thought, answer, _, _ = stream_parts((await chat(client, stream=True))[1])
    assert (thought, answer) == ("Hmm, a greeting.", "Hi!")


async def test_no_reasoning_content_field(serve):
    client, _ = await serve(FakeScript(tokens=[*QWEN]), reasoning_parser="qwen3", reasoning_content_field=False)
    message = json.loads((await chat(client))[1])["choices"][0]["message"]
    assert message["reasoning"] == THOUGHT and "reasoning_content" not in message
    _, _, thinking, _ = stream_parts((await chat(client, stream=True))[1])
    assert thinking and all(set(d) == {"reasoning"} for d in thinking)


async def test_without_a_parser_nothing_changes(serve):
    client, _ = await serve(FakeScript(tokens=[*QWEN]))
    data = json.loads((await chat(client))[1])
    assert data["choices"][0]["message"]["content"] == "".join(QWEN)
    assert "reasoning" not in data["choices"][0]["message"] and "completion_tokens_details" not in data["usage"]


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
async def test_think_then_call_a_tool(serve, parser):
    tokens = ["<think>", "Weather", " needs a tool", "</think>", "\n\n", *[CALL[i : i + 5] for i in range(0, len(CALL), 5)]]
    client, _ = await serve(FakeScript(tokens=[*tokens]), reasoning_parser=parser, enable_auto_tool_choice=True, tool_call_parser="hermes")
    data = json.loads((await chat(client, tools=[WEATHER]))[1])
    validate("CreateChatCompletionResponse", data)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["reasoning"] == "Weather needs a tool"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [("get_weather", '{"city": "Paris"}')]
    thought, answer, _, payloads = stream_parts((await chat(client, tools=[WEATHER], stream=True))[1])
    assert (thought, answer) == ("Weather needs a tool", "")
    calls = [tc for p in payloads for tc in p["choices"][0]["delta"].get("tool_calls", []) if p["choices"]]
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(tc["function"]["arguments"] for tc in calls) == '{"city": "Paris"}'
    assert payloads[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_a_call_inside_the_thinking_stays_thinking(serve):
    tokens = ["Maybe ", CALL, " no.", "</think>", "It is sunny."]
    client, _ = await serve(FakeScript(tokens=[*tokens]), reasoning_parser="deepseek_r1", enable_auto_tool_choice=True, tool_call_parser="hermes")
    choice = json.loads((await chat(client, tools=[WEATHER]))[1])["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["reasoning"] == "Maybe " + CALL + " no." and choice["message"]["content"] == "It is sunny."


async def test_template_kwargs_and_reasoning_effort_reach_the_template(serve):
    client, engine = await serve(
        FakeScript(tokens=["Hello"]), reasoning_parser="qwen3", default_chat_template_kwargs={"enable_thinking": False, "x": 1}
    )
    message = json.loads((await chat(client))[1])["choices"][0]["message"]
    assert engine.template_kwargs[-1] == {"enable_thinking": False, "x": 1}
    assert engine.submitted[-1][2].template_kwargs == {"enable_thinking": False, "x": 1}  # for an engine-side reasoning parser
    assert message == {"role": "assistant", "content": "Hello", "refusal": None}  # thinking off: no splitting at all
    await chat(client, chat_template_kwargs={"enable_thinking": True, "y": 2})
    assert engine.template_kwargs[-1] == {"enable_thinking": True, "x": 1, "y": 2}
    message = json.loads((await chat(client, reasoning_effort="high"))[1])["choices"][0]["message"]
    assert engine.template_kwargs[-1] == {"enable_thinking": True, "reasoning_effort": "high", "x": 1}
    assert message["reasoning"] == "Hello" and message["content"] == ""  # thinking on, never closed: all of it is thinking
    r, body = await chat(client, reasoning_effort="ludicrous")
    assert_openai_error(r.status, r.headers, body, expect_status=400, param="reasoning_effort")


async def test_n2_and_truncation(serve):
    client, _ = await serve(FakeScript(tokens=[*QWEN]), reasoning_parser="qwen3")
    data = json.loads((await chat(client, n=2, max_tokens=3))[1])
    for choice in data["choices"]:
        assert choice["finish_reason"] == "length"
        assert choice["message"]["reasoning"] == "\nThe user says hi" and choice["message"]["content"] == ""
    assert data["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}


async def test_openai_sdk_reads_reasoning(serve):
    client, _ = await serve(FakeScript(tokens=[*QWEN]), reasoning_parser="qwen3")
    async with openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="x", max_retries=0) as api:
        done = await api.chat.completions.create(model="fake", messages=USER_HI)
        stream = await api.chat.completions.create(model="fake", messages=USER_HI, stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
    message = done.choices[0].message
    # `reasoning` and `reasoning_content` are vendor fields: the SDK keeps them as extras (untyped).
    assert message.content == ANSWER and message.model_extra == {"reasoning": THOUGHT, "reasoning_content": THOUGHT}
    assert done.usage and done.usage.completion_tokens_details and done.usage.completion_tokens_details.reasoning_tokens == 3
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning", None) or "" for d in deltas) == THOUGHT
    assert "".join(d.content or "" for d in deltas) == ANSWER
    last_usage = chunks[-1].usage
    assert last_usage and last_usage.completion_tokens_details and last_usage.completion_tokens_details.reasoning_tokens == 3


# -- Responses --------------------------------------------------------------------------------


async def test_responses_reasoning_item_then_message(serve):
    client, engine = await serve(FakeScript(tokens=[*QWEN]), reasoning_parser="qwen3")
    r = await client.post("/v1/responses", json={"input": "hi", "reasoning": {"effort": "low"}})
    data = json.loads(await r.read())
    assert engine.template_kwargs[-1] == {"enable_thinking": True, "reasoning_effort": "low"}
    assert [i["type"] for i in data["output"]] == ["reasoning", "message"]
    assert data["output"][0]["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    assert data["output"][1]["content"][0]["text"] == ANSWER
    assert data["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}
    r = await client.post("/v1/responses", json={"input": "hi", "stream": True})
    events = named_events(await r.read())
    check_responses(events)
    responses_order(events)
    names = [e for e, _ in events]
    assert names.index("response.reasoning_text.done") < names.index("response.output_text.delta")
    assert "".join(p["delta"] for e, p in events if e == "response.reasoning_text.delta") == THOUGHT
    assert "".join(p["delta"] for e, p in events if e == "response.output_text.delta") == ANSWER
    assert events[-1][1]["response"]["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}
    async with openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="x", max_retries=0) as api:
        done = await api.responses.create(model="fake", input="hi")
        async with api.responses.stream(model="fake", input="hi") as stream:
            final = await stream.get_final_response()
    for resp in (done, final):
        reasoning, message = resp.output
        assert isinstance(reasoning, ResponseReasoningItem) and reasoning.content and reasoning.content[0].text == THOUGHT
        assert isinstance(message, ResponseOutputMessage) and resp.output_text == ANSWER
    r = await client.post("/v1/responses", json={"input": "hi", "reasoning": {"effort": "none"}})
    assert engine.template_kwargs[-1] == {"enable_thinking": False, "reasoning_effort": "none"}
    assert [i["type"] for i in json.loads(await r.read())["output"]] == ["message"]


# -- Anthropic ---------------------------------------------------------------------------------


async def test_anthropic_thinking_block_then_text(serve):
    client, engine = await serve(FakeScript(tokens=[*QWEN]), reasoning_parser="qwen3")
    body: MessageCreateParamsBase = {
        "model": "fake", "max_tokens": 50, "messages": HI, "thinking": {"type": "enabled", "budget_tokens": 1024}
    }
    r = await client.post("/v1/messages", json=dict(body))
    data = json.loads(await r.read())
    assert engine.template_kwargs[-1] == {"enable_thinking": True, "reasoning_effort": "medium"}
    assert engine.submitted[-1][2].template_kwargs == {"enable_thinking": True, "reasoning_effort": "medium"}
    assert data["content"] == [{"type": "thinking", "thinking": THOUGHT, "signature": ""}, {"type": "text", "text": ANSWER}]
    r = await client.post("/v1/messages", json={**body, "stream": True})
    events = named_events(await r.read())
    check_anthropic(events)
    anthropic_order(events)
    starts = [p["content_block"]["type"] for e, p in events if e == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert "".join(p["delta"]["thinking"] for e, p in events if e == "content_block_delta" and p["delta"]["type"] == "thinking_delta") == THOUGHT
    async with anthropic.AsyncAnthropic(base_url=str(client.make_url("")), api_key="x", max_retries=0) as api:
        async with api.messages.stream(**body) as stream:
            final = await stream.get_final_message()
        disabled = await api.messages.create(model="fake", max_tokens=50, messages=HI, thinking={"type": "disabled"})
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert isinstance(final.content[0], ThinkingBlock) and final.content[0].thinking == THOUGHT
    assert engine.template_kwargs[-1] == {"enable_thinking": False}
    assert [b.type for b in disabled.content] == ["text"]  # qwen3 with thinking off: no think block to split


async def test_anthropic_stop_sequence_inside_the_thinking(serve):
    client, _ = await serve(FakeScript(tokens=["<think>", "I say", " STOP", " now", "</think>", "Hi"]), reasoning_parser="qwen3")
    body = {"max_tokens": 50, "messages": USER_HI, "stop_sequences": ["STOP"]}
    data = json.loads(await (await client.post("/v1/messages", json=body)).read())
    assert data["content"] == [{"type": "thinking", "thinking": "I say ", "signature": ""}]
    assert (data["stop_reason"], data["stop_sequence"]) == ("stop_sequence", "STOP")


# -- LangChain ----------------------------------------------------------------------------------


def test_langchain_reads_reasoning_content():
    """ChatOpenAI targets OpenAI's spec only and drops `reasoning_content` (its docs say so);
    ChatDeepSeek (langchain-deepseek) reads it into additional_kwargs. Either way the content is clean."""
    from langchain_core.messages import HumanMessage
    from langchain_deepseek import ChatDeepSeek
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    text = "<think>Let me think.</think>Hello there.<|end|>"
    with fake_server("--fake-text", text, "--reasoning-parser", "qwen3") as base:
        deepseek = ChatDeepSeek(model="fake", api_key=SecretStr("x"), max_retries=0, stop_sequences=["<|end|>"], base_url=base + "/v1")
        msg = deepseek.invoke([HumanMessage("hi")])
        assert msg.content == "Hello there." and msg.additional_kwargs["reasoning_content"] == "Let me think."
        chunks = list(deepseek.stream([HumanMessage("hi")]))
        assert "".join(c.text for c in chunks) == "Hello there."
        assert "".join(c.additional_kwargs.get("reasoning_content", "") for c in chunks) == "Let me think."
        plain = ChatOpenAI(model="fake", api_key=SecretStr("x"), max_retries=0, stop_sequences=["<|end|>"], base_url=base + "/v1")
        msg = plain.invoke([HumanMessage("hi")])
        assert msg.content == "Hello there." and "reasoning_content" not in msg.additional_kwargs
        assert "".join(c.text for c in plain.stream([HumanMessage("hi")])) == "Hello there."


async def test_reasoning_parser_auto_splits_the_thinking_of_a_template_that_thinks(serve):
    client, _ = await serve(FakeScript(tokens=[*QWEN]), chat_template="{{- '<think>\\n\\n</think>\\n\\n' }}", reasoning_parser="auto")
    r, body = await chat(client)
    message = json.loads(body)["choices"][0]["message"]
    assert (r.status, message["content"], message["reasoning"]) == (200, ANSWER, THOUGHT)


async def test_reasoning_parser_auto_leaves_a_template_that_does_not_think_alone(serve):
    client, _ = await serve(FakeScript(tokens=[*QWEN]), chat_template="{{ messages }}", reasoning_parser="auto")
    r, body = await chat(client)
    message = json.loads(body)["choices"][0]["message"]
    assert (r.status, message["content"]) == (200, "".join(QWEN)) and "reasoning" not in message


async def test_reasoning_effort_map_rewrites_the_effort_the_template_sees_on_every_api(serve):
    """--reasoning-effort-map (vLLM 0.33): the template sees the mapped effort, on chat, Responses and
    Messages; thinking follows the mapped one ("none": off); efforts not listed pass unchanged; the
    request's own effort is still checked first."""
    client, engine = await serve(FakeScript(tokens=[*QWEN]), reasoning_parser="qwen3",
                                 reasoning_effort_map={"medium": "low", "xhigh": "max", "minimal": "none"})
    await chat(client, reasoning_effort="xhigh")
    assert engine.template_kwargs[-1] == {"enable_thinking": True, "reasoning_effort": "max"}
    await chat(client, reasoning_effort="high")
    assert engine.template_kwargs[-1] == {"enable_thinking": True, "reasoning_effort": "high"}
    await chat(client, reasoning_effort="minimal")
    assert engine.template_kwargs[-1] == {"enable_thinking": False, "reasoning_effort": "none"}
    await client.post("/v1/responses", json={"input": "hi", "reasoning": {"effort": "medium"}})
    assert engine.template_kwargs[-1] == {"enable_thinking": True, "reasoning_effort": "low"}
    await client.post("/v1/messages", json={"model": "fake", "max_tokens": 50, "messages": HI,
                                            "thinking": {"type": "enabled", "budget_tokens": 1024}})  # effort medium
    assert engine.template_kwargs[-1] == {"enable_thinking": True, "reasoning_effort": "low"}
    r, body = await chat(client, reasoning_effort="ludicrous")
    assert_openai_error(r.status, r.headers, body, expect_status=400, param="reasoning_effort")
