"""The edge: everything that touches aiohttp and the socket.

`app`/`server`/`connection` build and run the aiohttp application (`client_clock` a connection's client timeouts); `body` is a response's one
writer (framing, heartbeat, flow control, stall bound), `writer` serve's stream loop over it,
`nonstream` a slow JSON answer's; `routes/` are thin handlers; the rest are the edge's policies
(admission, drain, auth, CORS, deprecation, access log, metrics, tracing).

May import everything below it: `streamproxy.core`, `streamproxy.apis`,
`streamproxy.filters`, `streamproxy.protocol`, `streamproxy.errors`,
`streamproxy.config`, and the Engine protocol (`engine_adapter.base`).
Never vllm or torch: the engine is reached only through that protocol.
"""
