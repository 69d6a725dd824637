"""`streamproxy serve --ledger`: a mixed run (non-stream, stream, a client cut mid-stream, a 4xx, a
refused key) gives exactly one record per generation request with the tokens the client saw in
`usage`; a stream in flight at SIGTERM is written before the process exits; `streamproxy usage`
reads serve's ledger; a ledger that cannot be opened is a one-line start-up error naming --ledger; with
`--api-server-count 2` both workers write their records to one SQLite file. The mixed run on SQLite and on a
real PostgreSQL (the session's `postgres_server`)."""

from __future__ import annotations

import hashlib
import io
import json
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from harness.process import ROOT, free_port
from harness.server import FAKE_ARGS, start_server
from streamproxy.ledger.usage_cli import main as usage_main
from tests.support.workers import api_servers

MODEL = "books-model"
K1, K2 = "sk-serve-one", "sk-serve-two"


def _kid(secret: str) -> str:
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:12]


def _rows(path: Path) -> dict[str, dict[str, Any]]:
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    try:
        return {r["request_id"]: dict(r) for r in db.execute("SELECT * FROM ledger_requests")}
    finally:
        db.close()


def _pg_rows(url: str) -> dict[str, dict[str, Any]]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(url, row_factory=dict_row) as db:
        return {r["request_id"]: dict(r) for r in db.execute("SELECT * FROM ledger_requests")}


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/serve.db"
    return str(request.getfixturevalue("postgres_server").database())


def _read(url: str) -> dict[str, dict[str, Any]]:
    return _rows(Path(url[len("sqlite://"):])) if url.startswith("sqlite:") else _pg_rows(url)


def _post(base: str, path: str, body: dict[str, Any], rid: str, key: str | None = K1, **kw: Any) -> requests.Response:
    headers = {"X-Request-Id": rid, **({"Authorization": f"Bearer {key}"} if key else {})}
    return requests.post(base + path, json=body, headers=headers, timeout=30, **kw)


def _stream_usage(resp: requests.Response) -> dict[str, int]:
    usage: dict[str, int] = {}
    for raw in resp.iter_lines():
        if raw.startswith(b"data: {"):
            event = json.loads(raw[6:])
            if event.get("usage"):
                usage = event["usage"]
    return usage


def test_a_mixed_run_and_sigterm_give_one_record_each_with_the_clients_tokens(tmp_path: Path, ledger_url: str):
    server = start_server([*FAKE_ARGS, "--served-model-name", MODEL, "--fake-text", " word", "--fake-token-delay", "0.01",
                           "--api-key", K1, K2, "--ledger", ledger_url], tmp_path)
    try:
        base = server.base
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        plain = _post(base, "/v1/chat/completions", chat, "plain")
        assert plain.status_code == 200
        plain_usage = plain.json()["usage"]
        with _post(base, "/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}}, "stream",
                   key=K2, stream=True) as resp:
            stream_usage = _stream_usage(resp)
        emb = _post(base, "/v1/embeddings", {"model": MODEL, "input": "one two"}, "embed")
        assert emb.status_code == 400  # the fake engine embeds nothing: a 4xx on a generation route
        with _post(base, "/v1/chat/completions", {**chat, "stream": True, "max_tokens": 2000}, "cut", stream=True) as resp:
            seen = 0
            for raw in resp.iter_lines():  # three tokens, then gone
                seen += raw.startswith(b"data: {") and b'"content":" word"' in raw
                if seen == 3:
                    break
        bad = _post(base, "/v1/chat/completions", {**chat, "model": "no-such-model"}, "missing")
        assert bad.status_code == 404
        assert _post(base, "/v1/chat/completions", chat, "wrong-key", key="sk-wrong").status_code == 401
        assert requests.get(base + "/v1/models", headers={"Authorization": f"Bearer {K1}"}, timeout=30).status_code == 200
        # A stream in flight at SIGTERM: the drain lets it finish, and its record is written before the exit.
        started = threading.Event()
        late: dict[str, Any] = {}

        def client() -> None:
            with _post(base, "/v1/chat/completions", {**chat, "stream": True, "max_tokens": 60,
                                                      "stream_options": {"include_usage": True}}, "late", stream=True) as r:
                started.set()
                late.update(_stream_usage(r))

        thread = threading.Thread(target=client)
        thread.start()
        assert started.wait(30)
        server.proc.send_signal(signal.SIGTERM)
        thread.join(30)
        assert server.proc.wait(30) == 0
    finally:
        server.stop()
    rows = _read(ledger_url)
    assert sorted(rows) == ["cut", "embed", "late", "missing", "plain", "stream"]  # the 401 and /v1/models: none
    address = f"127.0.0.1:{server.port}"
    assert {r["deployment"] for r in rows.values()} == {MODEL}
    assert {r["replica"] for r in rows.values()} == {address}
    p = rows["plain"]
    assert (p["route"], p["status"], p["error_code"], p["key_id"], p["usage_source"]) == (
        "/v1/chat/completions", 200, None, _kid(K1), "billed")
    assert (p["prompt_tokens"], p["completion_tokens"], p["cached_prompt_tokens"]) == (
        plain_usage["prompt_tokens"], plain_usage["completion_tokens"], 0)
    s = rows["stream"]
    assert (s["key_id"], s["prompt_tokens"], s["completion_tokens"]) == (_kid(K2), stream_usage["prompt_tokens"], 5)
    assert stream_usage["completion_tokens"] == 5 and s["ttft_ms"] is not None and s["duration_ms"] >= s["ttft_ms"]
    assert (rows["late"]["prompt_tokens"], rows["late"]["completion_tokens"]) == (late["prompt_tokens"], 60)
    e = rows["embed"]
    assert (e["route"], e["status"], e["error_code"], e["key_id"], e["prompt_tokens"]) == (
        "/v1/embeddings", 400, emb.json()["error"]["code"], _kid(K1), None)
    c = rows["cut"]
    assert (c["status"], c["error_code"]) == (200, "client_disconnected")
    assert 3 <= c["completion_tokens"] < 2000  # what was sent before the server saw the client gone
    m = rows["missing"]
    assert (m["status"], m["error_code"], m["completion_tokens"], m["usage_source"]) == (404, "model_not_found", None, None)
    # `streamproxy usage` reads serve's ledger as it reads the gateway's.
    out = io.StringIO()
    assert usage_main(["--ledger", ledger_url, "--by", "key", "--json"], out) == 0
    by_key = {row["key_id"]: row for row in json.loads(out.getvalue())["data"]}
    assert by_key[_kid(K2)]["requests"] == 1 and by_key[_kid(K2)]["completion_tokens"] == 5
    assert by_key[_kid(K1)]["requests"] == 5


def test_a_ledger_that_cannot_be_opened_is_a_one_line_start_up_error(tmp_path: Path):
    (tmp_path / "file").write_text("")
    url = f"sqlite://{tmp_path}/file/ledger.db"  # its folder is a file
    done = subprocess.run([sys.executable, "-m", "streamproxy", "serve", *FAKE_ARGS, "--port", "0", "--ledger", url], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(f"--ledger: cannot open {url}: ")
    port = free_port()  # nothing listens there
    done = subprocess.run([sys.executable, "-m", "streamproxy", "serve", *FAKE_ARGS, "--port", "0", "--ledger",
                           f"postgresql://books:s3cret@127.0.0.1:{port}/ledger"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"--ledger: cannot open postgresql://books:***@127.0.0.1:{port}/ledger: OperationalError: ")
    assert "s3cret" not in done.stderr
    done = subprocess.run([sys.executable, "-m", "streamproxy", "serve", *FAKE_ARGS, "--port", "0", "--ledger", "mysql://x/y"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stderr.strip().splitlines()[-1] == (
        "--ledger: cannot open mysql://x/y: LedgerURLError: 'mysql://x/y' is not a ledger URL: use sqlite:///path/to/ledger.db, "
        "postgresql://..., or off")


def test_each_of_two_api_servers_writes_its_own_records_to_one_sqlite_ledger(tmp_path: Path):
    ledger = tmp_path / "workers.db"
    chat: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    with api_servers(2, "--served-model-name", MODEL, "--ledger", f"sqlite://{ledger}", log_dir=tmp_path) as srv:
        for i in range(40):  # new connections: the kernel spreads them over both workers
            r = requests.post(srv.url("/v1/chat/completions"), json=chat, headers={"X-Request-Id": f"w-{i}", "Connection": "close"},
                              timeout=30)
            assert r.status_code == 200
        assert srv.server.stop(30) == 0
        served_by = {line["pid"] for line in srv.log_lines()}
    assert len(served_by) == 2  # both wrote
    rows = _rows(ledger)
    assert sorted(rows) == sorted(f"w-{i}" for i in range(40))
    assert {r["completion_tokens"] for r in rows.values()} == {3}
    assert {r["key_id"] for r in rows.values()} == {None}
