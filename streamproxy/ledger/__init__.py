"""The request ledger: one record per request, written in batches off the request path, and queried.

Sans-IO: `records`, `keys`, `params` (query string -> query), `schema` (migrations of both SQL
dialects). With I/O: `store` (`LedgerStore`, `open_store`) and its `memory`, `sqlite`, `postgres`;
`writer` (`Ledger`: the bounded buffer and its batch writer task); `usage_cli`.

May import `streamproxy.errors`, msgspec and prometheus_client; never aiohttp,
`streamproxy.http` or `streamproxy.gateway` (the gateway imports the ledger,
not the other way round), never an engine. psycopg is imported lazily, in
`postgres` alone, so a gateway on SQLite never loads it.
"""
