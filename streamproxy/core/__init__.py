"""The sans-IO core: everything between a decoded request and the bytes of a response.

SSE framing, UTF-8 carry, the chat/completions stream encoders, the block
stream shared by the Responses and Anthropic encoders, accumulation of
non-streamed answers, sampling params, structured outputs, logprobs and
request preparation. Pure functions and small state machines fed by the
caller: no sockets, no tasks, no clocks.

May import: `streamproxy.errors`, `streamproxy.protocol`, `streamproxy.filters`,
the Engine protocol's value types (`engine_adapter.base`), and third-party
codecs (msgspec, orjson). Never aiohttp, asyncio I/O, vllm or torch
(tests/unit/test_layers.py fails if it does).
"""
