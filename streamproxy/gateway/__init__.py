"""`streamproxy gateway`: relaying to replicas instead of generating.

Sans-IO: `config`, `h1`, `relay`, `prefix`, `balance`, `health`, `limits`, `holds`, `lifecycle`,
`kube_pods`. With I/O: `wire`/`upstream`/`upstream_tls` (the replicas' client), `call`/`proxy`/`streaming`
(the relaying handlers), `probes`, `source` (where replicas come from: fixed, `managed`/`replicas`,
`kubernetes`/`kube_api`), `state`/`reload`, `app`, `routes`, `openapi`, `metrics`, `books`,
`keyring`/`keyadmin` and `deployadmin`/`deploysync` (keys and deployments made through the admin API).
Issue 35: `kv_events`, `kv_index`, `kv_feed`, `kv_score`, `fairq` (sans-IO:
replicas' KV-cache events, the index of their blocks, scoring by cached prefix, fair queueing) with
`kv_subscriber` (ZMQ), `flowcontrol` (awaiting a place) and `scheduler` (all of it per deployment, in
the request path: `Call.admit`, `Call.open`).

May import `streamproxy.core`, `apis`, `errors`, `config`, the edge
(`streamproxy.http`) and the ledger (`streamproxy.ledger`); never an engine: replicas are reached over HTTP only.
"""
