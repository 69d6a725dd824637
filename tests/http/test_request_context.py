"""The request context's finish subscribers (streamproxy/http/context.py): each called once per
request, in order, with what the request became; one that raises is logged and stops neither
the others nor the response."""

from __future__ import annotations

import logging

import pytest

from streamproxy.http.context import SUBSCRIBERS, RequestContext
from tests.http.conftest import Serve
from tests.support.fake import USER_HI


async def test_each_subscriber_once_in_order_and_one_that_raises_stops_nothing(serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    client, _ = await serve()
    seen: list[tuple[str, str, int, str | None, int | None]] = []

    def broken(ctx: RequestContext) -> None:
        seen.append(("broken", ctx.request_id, ctx.status, ctx.error_code, ctx.completion_tokens))
        raise RuntimeError("a subscriber's bug")

    def after(ctx: RequestContext) -> None:
        seen.append(("after", ctx.request_id, ctx.status, ctx.error_code, ctx.completion_tokens))

    client.server.app[SUBSCRIBERS].extend([broken, after])
    with caplog.at_level(logging.ERROR, logger="streamproxy"):
        ok = await client.post("/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 3}, headers={"X-Request-Id": "ctx-1"})
        assert ok.status == 200 and (await ok.json())["usage"]["completion_tokens"] == 3
        bad = await client.post("/v1/chat/completions", json={"model": "nope", "messages": USER_HI}, headers={"X-Request-Id": "ctx-2"})
        assert bad.status == 404
    assert seen == [
        ("broken", "ctx-1", 200, None, 3), ("after", "ctx-1", 200, None, 3),
        ("broken", "ctx-2", 404, "model_not_found", None), ("after", "ctx-2", 404, "model_not_found", None),
    ]
    failures = [r for r in caplog.records if "finish subscriber" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info is not None and "broken" in r.getMessage() for r in failures)
