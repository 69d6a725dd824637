"""The ledger of a `streamproxy gateway` process: a ledger that cannot be opened is a start-up
error naming the field; SIGTERM under load writes every record before the process exits (the
writer's interval far longer than the test, so only the flush can have written them); `kill -9`
loses at most the records of the last write interval."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from harness.process import ROOT
from harness.server import FAKE_ARGS, serve_process, start_gateway
from tests.gateway.conftest import refused_url
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat


def _config(upstream: str, **extra: object) -> dict:
    return {"access_log": "off", "drain_timeout": 30,
            "deployments": [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [upstream]}], **extra}


def _start_fails(tmp_path: Path, ledger: str) -> str:
    import yaml

    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(_config("http://127.0.0.1:9", ledger=ledger)))
    done = subprocess.run([sys.executable, "-m", "streamproxy", "gateway", "--config", str(path), "--port", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    return done.stderr.strip().splitlines()[-1]


def test_a_ledger_that_cannot_be_opened_is_a_start_up_error_naming_the_field(tmp_path: Path):
    port = refused_url().rsplit(":", 1)[1]
    last = _start_fails(tmp_path, f"postgresql://books:s3cret@127.0.0.1:{port}/ledger")
    assert last.startswith(f"gateway config: `ledger`: cannot open postgresql://books:***@127.0.0.1:{port}/ledger: OperationalError")
    assert "s3cret" not in last
    (tmp_path / "file").write_text("")
    last = _start_fails(tmp_path, f"sqlite://{tmp_path}/file/ledger.db")  # its folder is a file
    assert last.startswith(f"gateway config: `ledger`: cannot open sqlite://{tmp_path}/file/ledger.db: ")
    last = _start_fails(tmp_path, "mysql://127.0.0.1/ledger")
    assert last == (f"streamproxy gateway: {tmp_path / 'gw.yaml'}: gateway config: `ledger`: 'mysql://127.0.0.1/ledger' is not "
                    "a ledger URL: use sqlite:///path/to/ledger.db, postgresql://..., or off")  # a config error names its file


def _records(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [r[0] for r in db.execute("SELECT request_id FROM ledger_requests")]
    finally:
        db.close()


def test_sigterm_under_load_writes_every_record(tmp_path: Path):
    ledger = tmp_path / "ledger.db"
    replica_args = [*FAKE_ARGS, "--served-model-name", SERVED, "--fake-text", " word", "--fake-token-delay", "0.02"]
    with serve_process(replica_args, log_dir=tmp_path, name="replica") as replica:
        gw = start_gateway(_config(replica.base, ledger=f"sqlite://{ledger}", ledger_writer={"interval": 3600}), tmp_path)
        answered: list[str] = []
        started = threading.Barrier(17)

        def client(i: int) -> None:
            rid = f"term-{i}"
            started.wait()
            try:
                with requests.post(gw.url("/v1/chat/completions"), json=chat(stream=True, max_tokens=25), stream=True,
                                   headers={"X-Request-Id": rid}, timeout=30) as resp:
                    b"".join(resp.iter_content(chunk_size=None))
                    answered.append(rid)
            except requests.ConnectionError:
                pass  # refused after the drain began: it never reached the gateway

        try:
            for i in range(20):  # some before, with nothing written yet (the interval is an hour)
                assert requests.post(gw.url("/v1/chat/completions"), json=chat(max_tokens=2), headers={"X-Request-Id": f"pre-{i}"},
                                     timeout=30).status_code == 200
            threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
            for t in threads:
                t.start()
            started.wait()
            time.sleep(0.2)  # the streams are under way (each takes 0.5 s)
            gw.proc.send_signal(signal.SIGTERM)
            for t in threads:
                t.join(30)
            assert gw.proc.wait(30) == 0
        finally:
            gw.stop()
    got = _records(ledger)
    assert len(got) == len(set(got))
    assert set(got) >= {f"pre-{i}" for i in range(20)} | set(answered)
    assert len(answered) >= 1


def test_kill_9_loses_at_most_the_last_interval(tmp_path: Path):
    interval = 0.5
    ledger = tmp_path / "ledger.db"
    with serve_process([*FAKE_ARGS, "--served-model-name", SERVED], log_dir=tmp_path, name="replica") as replica:
        gw = start_gateway(_config(replica.base, ledger=f"sqlite://{ledger}", ledger_writer={"interval": interval}), tmp_path)
        finished: list[tuple[str, float]] = []
        try:
            http = requests.Session()
            deadline = time.monotonic() + 2.0
            i = 0
            while time.monotonic() < deadline:
                rid = f"k9-{i}"
                assert http.post(gw.url("/v1/chat/completions"), json=chat(max_tokens=2), headers={"X-Request-Id": rid},
                                 timeout=30).status_code == 200
                finished.append((rid, time.monotonic()))
                i += 1
            killed = time.monotonic()
            gw.proc.send_signal(signal.SIGKILL)
            gw.proc.wait(30)
        finally:
            gw.stop()
    got = set(_records(ledger))
    lost = [(rid, at) for rid, at in finished if rid not in got]
    window = killed - min(at for _, at in lost) if lost else 0.0
    # Everything answered before the last interval (plus the write in progress: slack for a busy machine) is there.
    assert window <= interval + 0.5, (window, len(lost), len(finished))
    assert len(got) > len(finished) / 2


def test_two_gateway_processes_on_one_postgresql_share_a_key_its_budget_and_its_revocation(tmp_path: Path, postgres_server):
    """Issue 28, across processes: a key made on one gateway works on the other within its refresh (a second),
    both count against one budget until each answers 429 `insufficient_quota`, and a revocation on one is a
    401 on the other."""
    url = postgres_server.database()
    env = {"GW_ADMIN": "sk-admin-two"}
    admin = {"Authorization": "Bearer sk-admin-two"}
    with serve_process([*FAKE_ARGS, "--served-model-name", SERVED], log_dir=tmp_path, name="replica") as replica:
        config = _config(replica.base, ledger=url, ledger_writer={"interval": 0.05}, admin_key_env="GW_ADMIN")
        a = start_gateway(config, tmp_path, name="gateway-a", env=env)
        b = start_gateway(config, tmp_path, name="gateway-b", env=env)
        try:
            made = requests.post(a.url("/v1/keys"), json={"id": "team-both", "deployments": ["*"], "budget_tokens": 100,
                                                          "budget_period": "month"}, headers=admin, timeout=10)
            assert made.status_code == 200, made.text
            key = {"Authorization": f"Bearer {made.json()['secret']}"}

            def use(gw) -> requests.Response:
                # max_tokens: the budget holds what a request may use (without it, the default 4096 > 100)
                return requests.post(gw.url("/v1/chat/completions"), json=chat(max_tokens=3), headers=key, timeout=10)

            def eventually(check, timeout: float = 5.0) -> bool:
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    if check():
                        return True
                    time.sleep(0.05)
                return False

            assert use(a).status_code == 200  # at once where it was made
            assert eventually(lambda: use(b).status_code == 200)  # within a refresh on the other process

            def over(gw) -> bool:
                r = use(gw)
                return r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"

            assert eventually(lambda: over(a)) and eventually(lambda: over(b))  # one budget, spent on both
            assert requests.delete(a.url("/v1/keys/team-both"), headers=admin, timeout=10).status_code == 200
            assert eventually(lambda: use(b).status_code == 401)
            listed = requests.get(b.url("/v1/keys"), headers=admin, timeout=10).json()["data"]
            assert [(k["id"], k["revoked"] is not None) for k in listed] == [("team-both", True)]
        finally:
            a.stop()
            b.stop()


def test_two_gateway_processes_on_one_postgresql_follow_a_deployment_posted_patched_and_deleted(tmp_path: Path, postgres_server):
    """Issue 28, across processes: a deployment POSTed on one gateway is routable on the other within a poll
    (`deploysync.REFRESH`, a second), a PATCH's new upstream is followed, and a DELETE is a 404 `model_not_found`
    there while a stream it runs on the deployment completes."""
    url = postgres_server.database()
    env = {"GW_ADMIN": "sk-admin-two"}
    admin = {"Authorization": "Bearer sk-admin-two"}
    slow_args = [*FAKE_ARGS, "--served-model-name", SERVED, "--fake-token-delay", "0.04"]
    with serve_process(slow_args, log_dir=tmp_path, name="slow") as slow, \
            serve_process([*FAKE_ARGS, "--served-model-name", SERVED], log_dir=tmp_path, name="fast") as fast:
        config = _config(fast.base, ledger=url, ledger_writer={"interval": 0.05}, admin_key_env="GW_ADMIN")
        a = start_gateway(config, tmp_path, name="gateway-a", env=env)
        b = start_gateway(config, tmp_path, name="gateway-b", env=env)
        try:
            def eventually(check, timeout: float = 3.0) -> bool:
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    if check():
                        return True
                    time.sleep(0.02)
                return False

            def ask(gw, **extra: object) -> requests.Response:
                return requests.post(gw.url("/v1/chat/completions"), json=chat("tenant-bot", max_tokens=1, **extra), timeout=10)

            def replicas_on_b() -> list[str]:
                got = requests.get(b.url("/v1/deployments/tenant-bot"), headers=admin, timeout=10)
                return [r["url"] for r in got.json()["replicas"]] if got.status_code == 200 else []

            made = requests.post(a.url("/v1/deployments"), json={"name": "tenant-bot", "id": "dep-tenant-bot",
                                                                   "served_model": SERVED, "upstreams": [slow.base]},
                                 headers=admin, timeout=10)
            assert made.status_code == 200, made.text
            posted = time.monotonic()
            assert ask(a).status_code == 200  # at once where it was made
            assert eventually(lambda: ask(b).status_code == 200)
            followed = time.monotonic() - posted
            assert followed < 2.5, followed  # a poll a second, and a request's time

            # A stream on b, on the deployment as POSTed (100 tokens, 4 s).
            streamed: list[bytes] = []

            def stream() -> None:
                with requests.post(b.url("/v1/chat/completions"), json=chat("tenant-bot", stream=True, max_tokens=100),
                                   stream=True, timeout=30) as resp:
                    streamed.append(resp.content)

            running = threading.Thread(target=stream)
            running.start()
            patched = requests.patch(a.url("/v1/deployments/dep-tenant-bot"), json={"upstreams": [fast.base]}, headers=admin, timeout=10)
            assert patched.status_code == 200, patched.text
            assert eventually(lambda: replicas_on_b() == [fast.base]) and ask(b).status_code == 200
            assert requests.delete(a.url("/v1/deployments/tenant-bot"), headers=admin, timeout=10).status_code == 200

            def gone_on_b() -> bool:
                r = ask(b)
                return r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"

            assert eventually(gone_on_b)
            assert running.is_alive()  # the stream outlived its deployment's change and deletion
            running.join(30)
            (body,) = streamed
            assert body.endswith(b"data: [DONE]\n\n") and b'"error"' not in body and body.count(b"data: ") == 103, body[-300:]  # role, 100 tokens, finish, [DONE]
        finally:
            a.stop()
            b.stop()
