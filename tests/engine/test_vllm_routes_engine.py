"""vLLM's hosting and render routes answered as vLLM's own server answers them, on the same
model and flags (the session's `engine_server` and `vllm_server`): `/ping` (GET and POST),
`/invocations` dispatched by body shape, the render routes' token ids (the model's real chat
template), and a request's own chat template refused the same way."""

from __future__ import annotations

import pytest
import requests

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def both(engine_server: str, vllm_server: str, method: str, path: str, **kwargs: object) -> tuple[requests.Response, requests.Response]:
    ours = requests.request(method, engine_server + path, timeout=120, **kwargs)  # type: ignore[arg-type]
    theirs = requests.request(method, vllm_server + path, timeout=120, **kwargs)  # type: ignore[arg-type]
    return ours, theirs


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_ping(engine_server, vllm_server, method):
    ours, theirs = both(engine_server, vllm_server, method, "/ping")
    assert (ours.status_code, ours.content) == (theirs.status_code, theirs.content) == (200, b"")


def test_invocations_by_body_shape(engine_server, vllm_server, model_name):
    chat = {"model": model_name, "messages": MESSAGES, "max_tokens": 5, "temperature": 0}
    ours, theirs = both(engine_server, vllm_server, "POST", "/invocations", json=chat)
    assert ours.status_code == theirs.status_code == 200
    assert ours.json()["object"] == theirs.json()["object"] == "chat.completion"
    assert ours.json()["usage"]["prompt_tokens"] == theirs.json()["usage"]["prompt_tokens"]
    assert ours.json()["choices"][0]["message"]["content"] == theirs.json()["choices"][0]["message"]["content"]
    text = {"model": model_name, "prompt": "The sky is", "max_tokens": 3, "temperature": 0}
    ours, theirs = both(engine_server, vllm_server, "POST", "/invocations", json=text)
    assert ours.json()["object"] == theirs.json()["object"] == "text_completion"
    assert ours.json()["choices"][0]["text"] == theirs.json()["choices"][0]["text"]
    # Any other object is a completion (vLLM's CompletionRequest takes it), refused for its missing prompt.
    ours, theirs = both(engine_server, vllm_server, "POST", "/invocations", json={"nothing": 1})
    assert ours.status_code == theirs.status_code == 400
    assert ours.json()["error"]["param"] == "prompt" and "prompt" in theirs.json()["error"]["message"]
    # Not an object: both 400. vLLM's message is a Python error from its SageMaker wrapper ("list indices
    # must be integers or slices, not str"); ours is the one vLLM's dispatcher means to send.
    ours, theirs = both(engine_server, vllm_server, "POST", "/invocations", json=["hi"])
    assert ours.status_code == theirs.status_code == 400
    assert ours.json()["error"]["message"].startswith("Cannot find suitable handler for request. Expected one of:")


def test_render_token_ids_as_vllm(engine_server, vllm_server, model_name):
    # (vLLM serves them with --enable-scale-out only, which `vllm_server` has; streamproxy always)
    chat = {"model": model_name, "messages": MESSAGES, "max_tokens": 7}
    ours, theirs = both(engine_server, vllm_server, "POST", "/v1/chat/completions/render", json=chat)
    assert ours.status_code == theirs.status_code == 200
    assert ours.json()["token_ids"] == theirs.json()["token_ids"]
    assert ours.json()["sampling_params"]["max_tokens"] == theirs.json()["sampling_params"]["max_tokens"] == 7
    text = {"model": model_name, "prompt": ["The sky is", "Grass is"], "max_tokens": 3}
    ours, theirs = both(engine_server, vllm_server, "POST", "/v1/completions/render", json=text)
    assert [e["token_ids"] for e in ours.json()] == [e["token_ids"] for e in theirs.json()]


def test_untrusted_request_template_refused_as_vllm(engine_server, vllm_server, model_name):
    body = {"model": model_name, "messages": MESSAGES, "max_tokens": 2, "chat_template": "{{ messages[0].content }}"}
    ours, theirs = both(engine_server, vllm_server, "POST", "/v1/chat/completions", json=body)
    assert ours.status_code == theirs.status_code == 400
    assert ours.json()["error"]["message"] == theirs.json()["error"]["message"]
