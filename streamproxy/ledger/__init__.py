"""The request ledger: one record per request, written in batches off the request path, and queried.

Sans-IO: `records` (the record, the queries and their answers, the cursor),
`keys` (API keys made through the admin API: their structs, secrets, rules),
`params` (an HTTP query string -> a query, OpenAI-shaped 400s), `schema`
(the versioned migrations of both SQL dialects). With I/O: `store` (the
`LedgerStore` protocol and `open_store(url)`), its implementations `memory`
(the fake), `sqlite` (stdlib sqlite3 in one worker thread, WAL) and
`postgres` (psycopg 3, async), `writer` (`Ledger`: the bounded buffer the
event loop appends to and the task that writes it in batches), `usage_cli`
(`streamproxy usage`).

May import `streamproxy.errors`, msgspec and prometheus_client; never aiohttp,
`streamproxy.http` or `streamproxy.gateway` (the gateway imports the ledger,
not the other way round), never an engine. psycopg is imported lazily, in
`postgres` alone, so a gateway on SQLite never loads it.
"""
