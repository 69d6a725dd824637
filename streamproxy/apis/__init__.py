"""Foreign APIs served on top of the chat core, one folder each.

Each folder keeps one API together: `protocol` (its msgspec wire structs),
`convert` (its request to the chat request the core prepares), `stream`
(its event encoder over the core's block stream), `spec` (its stream facts,
which the encoder and the gateway's relay both read; `apis/spec.py` holds
the `ApiSpec` they share and chat's) and, where the API has its own,
`errors` (its error body shape).

Sans-IO like `streamproxy.core`, which it may import along with
`streamproxy.protocol`, `streamproxy.filters` and `streamproxy.errors`.
Never aiohttp or an engine. The HTTP handlers live in `streamproxy.http.routes`.
"""
