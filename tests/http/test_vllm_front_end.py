"""vLLM's front-end flags and routes on the fake engine (one token per character): chat
templates and who may bring one, the response role, forced usage, token ids in logprobs,
tools hidden for tool_choice none, --root-path, /ping, /invocations, /load, the render
routes, and vLLM's routes that are not served."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from engine_adapter.fake import FakeScript
from harness.waiting import wait_until
from streamproxy.core.prepare import UNTRUSTED_TEMPLATE
from streamproxy.http import accesslog
from tests.support import sse
from tests.support.fake import USER_HI, USER_HI_PROMPT_TOKENS

TEMPLATE = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}>"
PARTS_TEMPLATE = "{% for m in messages %}{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endfor %}"


def text(ids: list[int]) -> str:
    return "".join(map(chr, ids))


async def test_chat_template_renders_the_prompt(serve):
    client, engine = await serve(template=TEMPLATE)
    r = await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 1})
    assert r.status == 200
    assert text(engine.submitted[-1][1]) == "[user]hi>"


async def test_request_template_refused_unless_trusted(serve):
    client, _ = await serve()
    body = {"messages": USER_HI, "chat_template": "{{ 'x' }}"}
    for route in ("/v1/chat/completions", "/tokenize"):
        r = await client.post(route, json=body)
        assert r.status == 400
        assert (await r.json())["error"] == {
            "message": UNTRUSTED_TEMPLATE, "type": "invalid_request_error", "param": "chat_template", "code": None}
    r = await client.post("/tokenize", json={"messages": USER_HI, "chat_template_kwargs": {"chat_template": "{{ 'x' }}"}})
    assert r.status == 400


async def test_trusted_request_template(serve):
    client, _ = await serve(trust_request_chat_template=True)
    r = await client.post("/tokenize", json={"messages": USER_HI, "chat_template": "{{ messages[0].content }}!"})
    assert (await r.json())["tokens"] == [ord(c) for c in "hi!"]


@pytest.mark.parametrize(("given", "template", "rendered"), [
    ("auto", PARTS_TEMPLATE, "<a><b>"),  # the template loops over content: parts
    ("openai", PARTS_TEMPLATE, "<a><b>"),
    ("auto", TEMPLATE, "[user]a\nb>"),  # it does not: one string
    ("string", TEMPLATE, "[user]a\nb>"),
])
async def test_content_format(serve, given, template, rendered):
    client, _ = await serve(template=template, chat_template_content_format=given)
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    r = await client.post("/tokenize", json={"messages": [{"role": "user", "content": content}]})
    assert text((await r.json())["tokens"]) == rendered


async def test_response_role(serve):
    client, _ = await serve(response_role="bot")
    r = await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 2})
    assert (await r.json())["choices"][0]["message"]["role"] == "bot"
    r = await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 2, "stream": True})
    first = sse.payloads(await r.read())[0]
    assert first["choices"][0]["delta"] == {"role": "bot", "content": ""}
    # vLLM's rule: without the generation prompt, the last message's role.
    r = await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 2, "add_generation_prompt": False})
    assert (await r.json())["choices"][0]["message"]["role"] == "user"


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_force_include_usage(serve, route):
    client, _ = await serve(enable_force_include_usage=True)
    body = {"messages": USER_HI} if "chat" in route else {"prompt": "hi"}
    r = await client.post(route, json={**body, "max_tokens": 3, "stream": True})
    last = sse.payloads(await r.read())[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3


async def test_return_tokens_as_token_ids(serve):
    client, _ = await serve(FakeScript(tokens=["A"]), return_tokens_as_token_ids=True)
    r = await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 1, "logprobs": True, "top_logprobs": 1})
    entry = (await r.json())["choices"][0]["logprobs"]["content"][0]
    # (the fake's sampled token id is its position)
    assert entry["token"] == "token_id:983040" and entry["bytes"] == list(b"token_id:983040")  # the fake's first generated id
    r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1, "logprobs": 0, "stream": True})
    assert sse.payloads(await r.read())[0]["choices"][0]["logprobs"]["tokens"] == ["token_id:983040"]


async def test_exclude_tools_when_tool_choice_none(serve):
    tools = [{"type": "function", "function": {"name": "f"}}]
    for exclude, shown in ((False, True), (True, False)):
        client, engine = await serve(exclude_tools_when_tool_choice_none=exclude)
        await client.post("/v1/chat/completions", json={"messages": USER_HI, "tools": tools, "tool_choice": "none", "max_tokens": 1})
        assert (engine.rendered[-1][1] is not None) is shown


async def test_root_path(serve):
    client, _ = await serve(root_path="/proxy", api_key=["k"])
    for path in ("/proxy/v1/models", "/v1/models"):
        assert (await client.get(path)).status == 401  # the key guards the prefixed routes too
        assert (await client.get(path, headers={"Authorization": "Bearer k"})).status == 200
    assert (await client.get("/proxy/health")).status == 200


async def test_ping(serve):
    client, engine = await serve()
    for method in ("GET", "POST"):
        r = await client.request(method, "/ping")
        assert r.status == 200 and await r.read() == b""
    engine.kill()
    assert (await client.get("/ping")).status == 503


async def test_invocations_dispatch_by_shape(serve):
    client, engine = await serve(FakeScript(tokens=["A", "B"]))
    r = await client.post("/invocations", json={"messages": USER_HI, "max_tokens": 2})
    assert (await r.json())["object"] == "chat.completion"
    assert len(engine.submitted[-1][1]) == USER_HI_PROMPT_TOKENS
    r = await client.post("/invocations", json={"prompt": "hi", "max_tokens": 2, "stream": True})
    assert sse.payloads(await r.read())[0]["object"] == "text_completion"
    r = await client.post("/invocations", json={"input": "hi"})  # a completion without a prompt (vLLM: the same)
    assert r.status == 400 and (await r.json())["error"]["param"] == "prompt"
    r = await client.post("/invocations", json=["hi"])
    assert r.status == 400
    assert (await r.json())["error"]["message"] == (
        "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest']")
    r = await client.post("/invocations", data=b"{nope")
    assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_json"


async def test_load(serve):
    client, _ = await serve()
    assert await (await client.get("/load")).json() == {"server_load": 0}
    client, _ = await serve(FakeScript(tokens=["A"] * 50, token_delay=0.05), enable_server_load_tracking=True)
    r = await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 50, "stream": True})
    await r.content.readline()  # the stream is under way
    assert await (await client.get("/load")).json() == {"server_load": 1}
    r.close()


async def test_render_chat(serve):
    client, engine = await serve()
    r = await client.post("/v1/chat/completions/render", json={"messages": USER_HI, "max_tokens": 5, "temperature": 0.5},
                          headers={"X-Request-Id": "r1"})
    body = await r.json()
    assert text(body["token_ids"]) == "<|user|>hi\n<|assistant|>"
    assert body["request_id"] == "chatcmpl-r1" and body["model"] is None and body["stream"] is False
    assert body["sampling_params"]["max_tokens"] == 5 and body["sampling_params"]["temperature"] == 0.5
    assert engine.submitted == []  # nothing generated
    r = await client.post("/v1/chat/completions/render", json={"messages": []})
    assert r.status == 400


async def test_render_completions(serve):
    client, engine = await serve()
    r = await client.post("/v1/completions/render", json={"prompt": ["ab", "c"], "max_tokens": 2}, headers={"X-Request-Id": "r2"})
    body = await r.json()
    assert [(e["request_id"], e["token_ids"]) for e in body] == [("cmpl-r2-0", [97, 98]), ("cmpl-r2-1", [99])]
    assert engine.submitted == []


async def test_vllm_routes_not_served_say_so(serve):
    client, _ = await serve()
    r = await client.post("/v1/score", json={})
    assert r.status == 404
    error = (await r.json())["error"]
    assert error["code"] == "route_not_supported" and error["message"].startswith(
        "POST /v1/score is a route of vLLM's server that streamproxy does not support: ")
    r = await client.post("/v1/chat/completions/derender", json={})
    assert r.status == 404 and (await r.json())["error"]["code"] == "route_not_supported"


async def test_disable_docs(serve):
    client, _ = await serve(disable_fastapi_docs=True)
    assert (await client.get("/openapi.json")).status == 404


@pytest.fixture
def access_lines() -> Any:
    lines: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(record.getMessage()))

    handler, previous = Collect(), accesslog.log.level
    accesslog.log.addHandler(handler)
    accesslog.log.setLevel(logging.INFO)
    yield lines
    accesslog.log.removeHandler(handler)
    accesslog.log.setLevel(previous)


@pytest.mark.parametrize("stream", [False, True])
async def test_log_outputs(serve, access_lines, stream):
    client, _ = await serve(FakeScript(tokens=["Hel", "lo", " world"]), enable_log_outputs=True, max_log_len=7)
    r = await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 3, "stream": stream})
    await r.read()
    r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "n": 2})
    await r.read()
    assert await wait_until(lambda: len(access_lines) == 2, timeout=5.0)
    assert access_lines[0]["output"] == "Hello w"  # "Hello world" cut to --max-log-len
    assert access_lines[1]["output"] == ["Hello", "Hello"]


async def test_no_output_in_the_log_by_default(serve, access_lines):
    client, _ = await serve()
    await (await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 2})).read()
    assert await wait_until(lambda: len(access_lines) == 1, timeout=5.0)
    assert "output" not in access_lines[0]


async def test_tokenizer_info(serve):
    client, _ = await serve()
    r = await client.get("/tokenizer_info")
    assert r.status == 404 and (await r.json())["error"]["code"] == "route_not_supported"
    client, _ = await serve(enable_tokenizer_info_endpoint=True, template=TEMPLATE)
    r = await client.get("/tokenizer_info")
    assert await r.json() == {"tokenizer_class": "none", "chat_template": TEMPLATE}  # the fake has no tokenizer object
    doc = await (await client.get("/openapi.json")).json()
    assert "get" in doc["paths"]["/tokenizer_info"]


RESPONSE = {"input": "hi", "max_output_tokens": 3}


@pytest.mark.parametrize("stream", [False, True])
async def test_stored_response(serve, stream):
    client, _ = await serve(responses_store=2)
    r = await client.post("/v1/responses", json={**RESPONSE, "stream": stream}, headers={"X-Request-Id": "a"})
    answer = await r.read()
    got = await client.get("/v1/responses/resp_a")
    assert got.status == 200
    body = await got.json()
    # max_output_tokens 3 ends it: "incomplete", as the answer itself said
    final = sse.named_events(answer)[-1][1]["response"] if stream else json.loads(answer)
    assert body == final
    assert (body["id"], body["status"], body["store"]) == ("resp_a", "incomplete", True)
    assert body["output"][0]["content"][0]["text"] == "Hello world"
    r = await client.post("/v1/responses/resp_a/cancel")
    assert r.status == 400 and (await r.json())["error"] == {
        "message": "Cannot cancel a synchronous response.", "type": "invalid_request_error", "param": "response_id", "code": None}


async def test_response_store_is_bounded_and_opt_in(serve):
    client, _ = await serve(responses_store=2)
    for rid in ("a", "b", "c"):
        await (await client.post("/v1/responses", json=RESPONSE, headers={"X-Request-Id": rid})).read()
    await (await client.post("/v1/responses", json={**RESPONSE, "store": False}, headers={"X-Request-Id": "d"})).read()
    assert [(await client.get(f"/v1/responses/resp_{rid}")).status for rid in "abcd"] == [404, 200, 200, 404]
    r = await client.get("/v1/responses/resp_a")
    assert (await r.json())["error"] == {
        "message": "Response with id 'resp_a' not found.", "type": "invalid_request_error", "param": "response_id",
        "code": "not_found"}
    client, _ = await serve()  # no store (vLLM without VLLM_ENABLE_RESPONSES_API_STORE): nothing kept
    r = await client.post("/v1/responses", json=RESPONSE, headers={"X-Request-Id": "e"})
    assert (await r.json())["store"] is False
    assert (await client.get("/v1/responses/resp_e")).status == 404
