"""What a migrating stream's record costs the gateway per event, per API, measured in-process without sockets.

    python -m bench.migration_feed [--tokens 2000] [--rounds 7]

A fake-engine `streamproxy serve` app answers one chat, one Responses and one Anthropic Messages stream
of `--tokens` tokens, without and with `return_token_ids`; each stream's events are then fed one event a
read (the worst case: a read per event) through the gateway's relay (`SSERelay.feed`), and the streams
with ids also through a serve replica's migration record (`resume.Stream.feed`: ids kept and stripped,
held steps, Responses' sequence numbers noted). The two ways alternate over `--rounds` rounds; printed:
µs of CPU (process time) per event, min / median / max. The record's cost on top of the relay's is what
a stream that may migrate pays while nothing breaks (docs/gateway.md, "Stream migration").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from aiohttp.test_utils import TestClient, TestServer

from engine_adapter.fake import FakeEngine, FakeScript
from streamproxy.apis.anthropic.spec import ANTHROPIC
from streamproxy.apis.responses.spec import RESPONSES
from streamproxy.apis.spec import OPENAI, ApiSpec
from streamproxy.config import Settings
from streamproxy.gateway.relay import SSERelay
from streamproxy.gateway.resume import Stream
from streamproxy.http.app import create_app

HI = [{"role": "user", "content": "hi"}]
APIS: list[tuple[str, ApiSpec]] = [("/v1/chat/completions", OPENAI), ("/v1/responses", RESPONSES), ("/v1/messages", ANTHROPIC)]


async def _streams(tokens: int) -> dict[tuple[str, bool], bytes]:
    engine = FakeEngine(FakeScript(tokens=[" tok"] * tokens))
    bodies = {"/v1/chat/completions": {"messages": HI, "max_tokens": tokens}, "/v1/responses": {"input": "hi", "max_output_tokens": tokens},
              "/v1/messages": {"messages": HI, "max_tokens": tokens}}
    out = {}
    async with TestClient(TestServer(create_app(Settings(engine="fake"), engine))) as client:
        while engine.state != "ready":
            await asyncio.sleep(0.05)
        for path, body in bodies.items():
            for ids in (False, True):
                r = await client.post(path, json={"model": "fake", "stream": True, "return_token_ids": ids, **body})
                out[path, ids] = await r.read()
    return out


def _per_event(path: str, api: ApiSpec, raw: bytes, tracked: bool) -> float:
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    relay = SSERelay(api, served="fake", public="fake", strip_usage=False)
    record = Stream(path, {}, limit=1 << 20, migrations=2, client_ids=False, usage_chunk=True) if tracked else None
    if record is not None:
        record.replica(True)  # a `streamproxy serve` replica's stream
    start = time.process_time()
    for event in events:
        block = relay.feed(event)
        if record is not None:
            record.feed(block)
    return (time.process_time() - start) / len(events) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    streams = asyncio.run(_streams(args.tokens))
    for path, api in APIS:
        times: dict[str, list[float]] = {"relay (no ids)": [], "relay + record (ids)": []}
        for _ in range(args.rounds):
            times["relay (no ids)"].append(_per_event(path, api, streams[path, False], False))
            times["relay + record (ids)"].append(_per_event(path, api, streams[path, True], True))
        for name, values in times.items():
            print(f"{path:22s} {name:22s} µs/event  min {min(values):6.2f}  median {statistics.median(values):6.2f}  max {max(values):6.2f}")


if __name__ == "__main__":
    main()
