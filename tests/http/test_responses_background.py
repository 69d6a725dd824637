"""Responses' `background: true` on the fake engine: created at once, run by the server, polled, cancelled."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from engine_adapter.fake import FakeScript
from harness.waiting import wait_until
from streamproxy.http.routes import background
from streamproxy.http.routes.background import NO_STORE
from streamproxy.http.state import STATE_KEY
from tests.http.http_support import assert_openai_error
from tests.support import sse

REQUEST = {"input": "hi", "max_output_tokens": 3}
SLOW = FakeScript(tokens=["a"] * 200, token_delay=0.02)  # 200 tokens: seconds, so a cancel lands mid-generation


async def _poll(client: Any, rid: str, timeout: float = 10.0) -> dict[str, Any]:
    """GET the response until it is no longer queued or in progress."""
    deadline = time.monotonic() + timeout
    while True:
        r = await client.get(f"/v1/responses/{rid}")
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
        if body["status"] not in ("queued", "in_progress") or time.monotonic() > deadline:
            return body
        await asyncio.sleep(0.01)


def _comparable(body: dict[str, Any]) -> dict[str, Any]:
    """All but the time, the store/background echo and the output items' ids (random per response)."""
    out = {k: v for k, v in body.items() if k not in ("created_at", "background", "store")}
    out["output"] = [{k: v for k, v in item.items() if k != "id"} for item in body["output"]]
    return out


async def test_background_completes_with_the_synchronous_output(serve):
    client, engine = await serve(responses_store=4)
    sync = await (await client.post("/v1/responses", json={**REQUEST, "store": False}, headers={"X-Request-Id": "a"})).json()
    r = await client.post("/v1/responses", json={**REQUEST, "background": True}, headers={"X-Request-Id": "a"})
    assert r.status == 200
    created = await r.json()
    assert (created["id"], created["status"], created["background"], created["store"]) == ("resp_a", "queued", True, True)
    assert (created["output"], created["usage"]) == ([], None)
    done = await _poll(client, "resp_a")
    assert (done["status"], done["background"]) == ("incomplete", True)  # max_output_tokens 3, as the sync call said
    assert _comparable(done) == _comparable(sync)
    assert done["output"][0]["content"][0]["text"] == "Hello world"
    assert engine.num_running == 0
    r = await client.post("/v1/responses/resp_a/cancel")  # finished: vLLM's 400
    assert_openai_error(r.status, r.headers, await r.read(), expect_status=400, param="response_id")


async def test_cancel_mid_generation_aborts_the_engine_request(serve):
    client, engine = await serve(SLOW, responses_store=4)
    r = await client.post("/v1/responses", json={"input": "hi", "background": True}, headers={"X-Request-Id": "c"})
    assert (await r.json())["status"] == "queued"
    assert await wait_until(lambda: engine.num_running == 1, 5.0)
    body: dict[str, Any] = {}
    for _ in range(1000):  # GET shows it running, with the output so far once tokens came
        body = await (await client.get("/v1/responses/resp_c")).json()
        if body["status"] == "in_progress" and body["output"]:
            break
        await asyncio.sleep(0.01)
    assert body["status"] == "in_progress" and body["usage"] is None, body
    r = await client.post("/v1/responses/resp_c/cancel")
    assert r.status == 200
    cancelled = await r.json()
    assert cancelled["status"] == "cancelled"
    assert engine.num_running == 0  # aborted before the cancel answered
    got = await (await client.get("/v1/responses/resp_c")).json()
    assert got == cancelled
    text = got["output"][0]["content"][0]["text"]
    assert 0 < len(text) < 200 and set(text) == {"a"}
    assert not client.server.app[STATE_KEY].background
    r = await client.post("/v1/responses/resp_c/cancel")
    body = assert_openai_error(r.status, r.headers, await r.read(), expect_status=400, param="response_id")
    assert body["message"] == "Cannot cancel a synchronous response."


async def test_client_leaving_after_the_create_does_not_stop_it(serve):
    client, engine = await serve(FakeScript(tokens=["Hel", "lo", " world"], token_delay=0.05), responses_store=4)
    payload = json.dumps({**REQUEST, "background": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
    writer.write(
        b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Request-Id: gone\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    writer.close()  # gone before reading the body, while the engine generates
    await writer.wait_closed()
    done = await _poll(client, "resp_gone")
    assert done["status"] == "incomplete" and done["output"][0]["content"][0]["text"] == "Hello world"
    assert engine.num_running == 0


async def test_background_errors(serve):
    client, _ = await serve(responses_store=4)
    r = await client.post("/v1/responses", json={**REQUEST, "background": True, "store": False})
    body = assert_openai_error(r.status, r.headers, await r.read(), expect_status=400, param="background")
    assert body["message"] == "background can only be used when `store` is true"
    await (await client.post("/v1/responses", json={**REQUEST, "background": True}, headers={"X-Request-Id": "n"})).read()
    r = await client.get("/v1/responses/resp_n", params={"stream": "true"})  # not made with stream: no events kept
    assert_openai_error(r.status, r.headers, await r.read(), expect_status=400, param="stream")
    for method, path in (("GET", "/v1/responses/resp_nope"), ("POST", "/v1/responses/resp_nope/cancel")):
        r = await client.request(method, path)
        body = assert_openai_error(r.status, r.headers, await r.read(), expect_status=404, param="response_id")
        assert body["message"] == "Response with id 'resp_nope' not found."
    client, _ = await serve()  # no store: vLLM without VLLM_ENABLE_RESPONSES_API_STORE
    r = await client.post("/v1/responses", json={**REQUEST, "background": True})
    body = assert_openai_error(r.status, r.headers, await r.read(), expect_status=400, param="background")
    assert body["message"] == NO_STORE


async def test_running_background_responses_are_bounded_by_the_store(serve):
    client, engine = await serve(SLOW, responses_store=1)
    r = await client.post("/v1/responses", json={"input": "hi", "background": True}, headers={"X-Request-Id": "one"})
    assert r.status == 200
    r = await client.post("/v1/responses", json={"input": "hi", "background": True}, headers={"X-Request-Id": "two"})
    assert_openai_error(r.status, r.headers, await r.read(), expect_status=429)
    assert (await client.get("/v1/responses/resp_two")).status == 404
    assert (await (await client.post("/v1/responses/resp_one/cancel")).json())["status"] == "cancelled"
    assert engine.num_running == 0


@pytest.mark.parametrize(("script", "deadline", "status"), [(SLOW, 0.0, "failed"), (FakeScript(tokens=["a"] * 3, token_delay=0.02), 30.0, "completed")])
async def test_a_drain_lets_background_responses_finish_until_its_deadline(serve, script, deadline, status):
    client, engine = await serve(script, responses_store=4)
    await (await client.post("/v1/responses", json={"input": "hi", "background": True}, headers={"X-Request-Id": "d"})).read()
    assert await wait_until(lambda: engine.num_running == 1, 5.0)
    state = client.server.app[STATE_KEY]
    state.inflight.begin_drain(asyncio.get_running_loop().time() + deadline)
    assert await state.inflight.wait_idle(10.0)
    assert await wait_until(lambda: not state.background, 5.0)  # the tasks end right after their lifetime
    assert engine.num_running == 0
    body = await (await client.get("/v1/responses/resp_d")).json()
    assert body["status"] == status, body
    if status == "failed":  # ended at the deadline, as a drain ends any request
        assert body["error"]["code"] == "server_error" and "shutting down" in body["error"]["message"], body


async def test_shutdown_cancels_what_still_runs(serve):
    client, engine = await serve(SLOW, responses_store=4)
    await (await client.post("/v1/responses", json={"input": "hi", "background": True}, headers={"X-Request-Id": "x"})).read()
    assert await wait_until(lambda: engine.num_running == 1, 5.0)
    await background.stop(client.server.app)  # the app's on_shutdown
    assert engine.num_running == 0
    assert client.server.app[STATE_KEY].responses.get("resp_x").startswith(b'{"id":"resp_x"')
    assert json.loads(client.server.app[STATE_KEY].responses.get("resp_x"))["status"] == "cancelled"


async def test_background_stream_and_resume(serve):
    client, engine = await serve(responses_store=4)
    sync = await (await client.post("/v1/responses", json={**REQUEST, "stream": True, "store": False})).read()
    r = await client.post("/v1/responses", json={**REQUEST, "stream": True, "background": True}, headers={"X-Request-Id": "s"})
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    body = await r.read()
    events = sse.named_events(body)
    assert [name for name, _ in events] == [name for name, _ in sse.named_events(sync)]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    final = events[-1][1]["response"]
    assert (final["status"], final["background"], final["output"][0]["content"][0]["text"]) == ("incomplete", True, "Hello world")
    assert await (await client.get("/v1/responses/resp_s")).json() == final
    frames = [frame + b"\n\n" for frame in body.split(b"\n\n")[:-1]]
    for after in (-1, 2, len(frames) - 1):  # a resume replays the same bytes from sequence number after+1
        r = await client.get("/v1/responses/resp_s", params={"stream": "true", "starting_after": str(after)})
        assert await r.read() == b"".join(frames[after + 1:])
    r = await client.get("/v1/responses/resp_s", params={"stream": "true", "starting_after": "x"})
    assert_openai_error(r.status, r.headers, await r.read(), expect_status=400, param="starting_after")
    assert engine.num_running == 0


async def test_background_stream_outlives_its_client_and_resumes_live(serve):
    client, engine = await serve(FakeScript(tokens=["a"] * 20, token_delay=0.02), responses_store=4)
    r = await client.post("/v1/responses", json={"input": "hi", "stream": True, "background": True}, headers={"X-Request-Id": "l"})
    first = await r.content.readuntil(b"\n\n")  # response.created
    assert first.startswith(b"event: response.created\n")
    r.close()  # the client goes away mid-generation
    follower = await client.get("/v1/responses/resp_l", params={"stream": "true", "starting_after": "0"})
    rest = await follower.read()  # follows it live to the end
    events = sse.named_events(first + rest)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert events[-1][0] == "response.completed"
    assert events[-1][1]["response"]["output"][0]["content"][0]["text"] == "a" * 20
    assert engine.num_running == 0


async def test_cancelling_a_streamed_background_response_ends_its_followers(serve):
    client, engine = await serve(SLOW, responses_store=4)
    r = await client.post("/v1/responses", json={"input": "hi", "stream": True, "background": True}, headers={"X-Request-Id": "k"})
    assert (await r.content.readuntil(b"\n\n")).startswith(b"event: response.created\n")
    cancel = await client.post("/v1/responses/resp_k/cancel")
    assert (await cancel.json())["status"] == "cancelled" and engine.num_running == 0
    rest = await r.read()  # the stream ends (no terminal event: OpenAI has no cancelled event)
    assert [name for name, _ in sse.named_events(rest)][-1] != "response.completed"
    assert (await (await client.get("/v1/responses/resp_k")).json())["status"] == "cancelled"
