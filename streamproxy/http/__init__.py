"""The edge: everything that touches aiohttp and the socket.

`app`/`server` build and run the aiohttp application (`connection`: one client
connection's timeouts, the connection cap); `body` is a response's one writer once
it starts (framing, the heartbeat: serve's and the gateway's one keep-alive
mechanism, flow control, the write-stall bound), the only code that writes to a
client's socket; `writer` is serve's stream loop over it (late errors in-band),
`nonstream` a slow JSON answer's; `routes/` are thin handlers (decode, admit,
generate, encode, write); `state` holds what one server shares; the rest
are the edge's policies: admission, drain, auth, CORS, deprecation headers,
the access log and the metrics.

May import everything below it: `streamproxy.core`, `streamproxy.apis`,
`streamproxy.filters`, `streamproxy.protocol`, `streamproxy.errors`,
`streamproxy.config`, and the Engine protocol (`engine_adapter.base`).
Never vllm or torch: the engine is reached only through that protocol.
"""
