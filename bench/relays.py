"""Start the relays under test in front of the same upstreams (bench/servers.py's `Server`).

Each writes its configuration into the benchmark's temp dir and listens on a
free 127.0.0.1 port:

- `gateway_server`: `streamproxy gateway --config` with one deployment
  named `public` (default: the upstreams' own name, `fake`, so the client
  sends the same request to every relay; another name makes the gateway
  rename the model both ways) and the `upstream:` policy given (default:
  the gateway's defaults);
- `nginx_server`: nginx (Debian's `nginx-light`), `daemon off`, one worker,
  `proxy_buffering off`, HTTP/1.1 with upstream keepalive, round robin, pid
  and logs (access log on, as by default) in the temp dir. The process we
  start is nginx's master; its worker is its child;
- `litellm_server`: the LiteLLM proxy from its own venv (`.venv/litellm`,
  `make bench-install`), one `openai/fake` model_list entry per upstream
  under one name, `public` (its router shuffles between them), no database, no
  master key, LITELLM_LOG=ERROR, telemetry off, and the LITELLM_LOCAL_*
  switches so it fetches nothing (model cost map etc.) from the network.

`relay_pids(srv)`: the process and its descendants, for CPU accounting.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from . import procstat
from .servers import RESULTS, ROOT, Server, free_port

UPSTREAM_NAME = "fake"        # the fake upstreams' model
NGINX = "/usr/sbin/nginx"


def relay_pids(srv: Server) -> list[int]:
    return [srv.pid, *procstat.descendants(srv.pid)]


def _log(tag: str, label: str) -> Path:
    return RESULTS / "logs" / f"{tag}-{label}.log"


def gateway_server(upstreams: list[str], tag: str, tmp: Path, *, policy: dict | None = None,
                   label: str = "gateway", served: str = UPSTREAM_NAME, public: str | None = None) -> Server:
    port = free_port()
    config = {"host": "127.0.0.1", "port": port,
              "deployments": [{"name": public or served, "id": "dep-bench", "served_model": served,
                               "upstreams": upstreams}],
              "upstream": policy or {}}
    path = tmp / f"{label}.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    cmd = [sys.executable, "-m", "streamproxy", "gateway", "--config", str(path)]
    return Server(label, cmd, port, _log(tag, label))


NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log {tmp}/nginx-access.log;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    fastcgi_temp_path {tmp}/nginx-fastcgi;
    uwsgi_temp_path {tmp}/nginx-uwsgi;
    scgi_temp_path {tmp}/nginx-scgi;
    upstream replicas {{
{servers}
        keepalive 512;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def nginx_server(upstreams: list[str], tag: str, tmp: Path) -> Server:
    binary = shutil.which("nginx") or NGINX
    if not Path(binary).exists():
        raise RuntimeError("nginx is not installed: `make bench-install` (apt-get install -y nginx-light)")
    port = free_port()
    servers = "\n".join(f"        server {u.split('://', 1)[1].rstrip('/')};" for u in upstreams)
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, port=port, servers=servers))
    cmd = [binary, "-p", str(tmp), "-e", str(tmp / "nginx-error.log"), "-c", str(conf)]
    return Server("nginx", cmd, port, _log(tag, "nginx"))


def litellm_binary() -> Path | None:
    """`.venv/litellm/bin/litellm` of this tree, or beside the venv this Python runs in."""
    for venv in (ROOT / ".venv" / "litellm", Path(sys.prefix) / "litellm"):
        if (venv / "bin" / "litellm").exists():
            return venv / "bin" / "litellm"
    return None


LITELLM_ENV = {
    "LITELLM_LOG": "ERROR",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "NO_PROXY": "127.0.0.1,localhost",
}


def litellm_server(upstreams: list[str], tag: str, tmp: Path, public: str = UPSTREAM_NAME) -> Server:
    binary = litellm_binary()
    if binary is None:
        raise RuntimeError("LiteLLM is not installed: `make bench-install` (its own venv, .venv/litellm)")
    port = free_port()
    config = {
        "model_list": [{"model_name": public,
                        "litellm_params": {"model": f"openai/{UPSTREAM_NAME}", "api_base": u.rstrip("/") + "/v1",
                                           "api_key": "none"}} for u in upstreams],
        "litellm_settings": {"telemetry": False, "request_timeout": 600},
        "general_settings": {"disable_spend_logs": True},
    }
    path = tmp / "litellm.yaml"
    path.write_text(json.dumps(config, indent=1))
    cmd = [str(binary), "--config", str(path), "--host", "127.0.0.1", "--port", str(port), "--telemetry", "False",
           "--num_workers", "1"]
    return Server("litellm", cmd, port, _log(tag, "litellm"), dict(LITELLM_ENV), health_path="/health/liveliness")
