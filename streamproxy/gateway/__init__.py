"""`streamproxy gateway`: relaying to replicas instead of generating.

Sans-IO: `config` (the YAML), `relay` (a replica's SSE bytes -> the client's,
with the model renamed and usage metered), `prefix` (prompt-prefix keys and
the per-replica index), `balance` (choosing a replica), `health` (outlier
ejection and probes' verdicts), `limits` (per-key rates), `holds` (a
request's worst case held against its key's token budget), `lifecycle` (a
managed deployment's states). With I/O: `upstream` (sending with failover),
`proxy` (the relaying handlers), `probes` (active health checks), `source`
(where a deployment's replicas come from: one interface, `ReplicaSource`),
`managed` and `replicas` (the replicas the gateway runs itself), `kubernetes`
(pods found through the Kubernetes API: `kube_api` its calls, `kube_pods` its
sans-IO part),
`routes` (the route
table), `openapi` (GET /openapi.json, serve's builder), `app` (routes and
life cycle), `metrics`, `books` (a ledger record per request; the ledger's
query routes), `keyring` and `keyadmin` (keys made through the admin API),
`deployadmin` and `deploysync` (deployments made through it, and followed in the ledger's store).
Issue 35: `kv_events`, `kv_index`, `kv_feed`, `kv_score`, `fairq` (sans-IO:
replicas' KV-cache events, the index of their blocks, scoring by cached prefix, fair queueing) with
`kv_subscriber` (ZMQ), `flowcontrol` (awaiting a place) and `scheduler` (all of it per deployment, in
the request path: `Call.admit`, `Call.open`).

May import `streamproxy.core`, `apis`, `errors`, `config`, the edge
(`streamproxy.http`) and the ledger (`streamproxy.ledger`); never an engine: replicas are reached over HTTP only.
"""
