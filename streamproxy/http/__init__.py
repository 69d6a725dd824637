"""The edge: everything that touches aiohttp and the socket.

`app`/`server` build and run the aiohttp application; `writer` is the sole
owner of a response once it starts (headers, heartbeats, write-stall bound,
late errors; `nonstream` for a JSON body); `keepalive` says when a keepalive
is due and what it is, for serve and the gateway alike; `chunked` is the
chunk framing of bytes written straight to the transport; `routes/` are thin handlers (decode, admit,
generate, encode, write); `state` holds what one server shares; the rest
are the edge's policies: admission, drain, auth, CORS, deprecation headers,
the access log and the metrics.

May import everything below it: `streamproxy.core`, `streamproxy.apis`,
`streamproxy.filters`, `streamproxy.protocol`, `streamproxy.errors`,
`streamproxy.config`, and the Engine protocol (`engine_adapter.base`).
Never vllm or torch: the engine is reached only through that protocol.
"""
