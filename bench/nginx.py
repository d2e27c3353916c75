"""Debian's nginx as the reference proxy: the same TLS termination and upstream re-encryption as ncpsim's.

nginx terminates TLS for `*.<workerDomain>` with the proxy's frontend certificate, accepts the worker's
absolute-form request line, routes by the target host (a `map` from pod name to upstream), and opens
TLS to the pod's 8443 verifying the pod certificate against the stack CA and the pod name
(`proxy_ssl_verify on`, `proxy_ssl_trusted_certificate`, `proxy_ssl_name`). Any other path is 404.
Upstream connections are kept alive and shared, as Envoy's connection pool does; `upstream_keepalive`
False makes nginx open a new upstream connection per request instead. A worker's own TLS connection is
kept alive as long as the worker keeps it: Envoy's listener sets no limit of requests per connection and
an idle timeout of an hour, so nginx gets a request limit no benchmark reaches and a long idle timeout,
downstream and upstream (nginx's defaults close after 1,000 requests, and after 75 s / 60 s idle).
One worker process, so it has one core as ncpsim's single-process proxy has.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.procs import free_port, group_members, spawn, stop

READY_TIMEOUT = 10.0
KEEPALIVE_REQUESTS = 1_000_000  # per connection: more than any run sends, as Envoy has no limit
KEEPALIVE_IDLE = "300s"  # longer than any pause in a run (Envoy's idle timeout is an hour)
TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


@dataclass(frozen=True)
class NginxSite:
    frontend_cert: Path
    frontend_key: Path
    upstream_ca: Path
    pods: dict[str, tuple[str, int]]  # pod name (dashed IP under the service) -> real loopback address
    upstream_keepalive: bool = True


def render(site: NginxSite, port: int, folder: Path) -> str:
    """The whole nginx.conf for `site`, listening on 127.0.0.1:`port`, everything else under `folder`."""
    pool = (
        f" keepalive 64; keepalive_requests {KEEPALIVE_REQUESTS}; keepalive_timeout {KEEPALIVE_IDLE};"
        if site.upstream_keepalive
        else ""
    )
    upstreams = "\n".join(
        f"  upstream pod_{i} {{ server {host}:{real};{pool} }}"
        for i, (host, real) in enumerate(site.pods.values())
    )
    routes = "\n".join(f"    {name} pod_{i};" for i, name in enumerate(site.pods))
    temps = "\n".join(f"  {d}_temp_path {folder / d};" for d in TEMP_DIRS)
    return f"""worker_processes 1;
daemon off;
pid {folder / "nginx.pid"};
error_log {folder / "error.log"} warn;
{"user root;" if os.geteuid() == 0 else ""}
events {{ worker_connections 4096; }}
http {{
  access_log {folder / "access.log"};
  keepalive_requests {KEEPALIVE_REQUESTS};
  keepalive_timeout {KEEPALIVE_IDLE};
{temps}
  map $host $pod_upstream {{
    default "";
{routes}
  }}
{upstreams}
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {site.frontend_cert};
    ssl_certificate_key {site.frontend_key};
    ssl_protocols TLSv1.2 TLSv1.3;
    location = /v2/nvcf/worker/request-attach {{
      if ($pod_upstream = "") {{ return 404; }}
      proxy_pass https://$pod_upstream;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-Proto https;
      proxy_ssl_verify on;
      proxy_ssl_verify_depth 2;
      proxy_ssl_trusted_certificate {site.upstream_ca};
      proxy_ssl_server_name on;
      proxy_ssl_name $host;
      proxy_read_timeout 300s;
    }}
    location / {{ return 404; }}
  }}
}}
"""


def _wait_listening(port: int, proc: subprocess.Popen, log: Path) -> None:
    """nginx has no readiness pipe: wait until its port accepts, or it exits."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"nginx exited with {proc.returncode}: {log.read_text(errors='replace')[-800:]}"
            )
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"nginx did not listen on {port} within {READY_TIMEOUT}s")


@dataclass
class RunningNginx:
    port: int
    proc: subprocess.Popen
    folder: Path

    def pids(self) -> list[int]:
        return group_members(self.proc.pid)


@contextlib.contextmanager
def nginx(site: NginxSite, folder: Path) -> Iterator[RunningNginx]:
    """Start nginx with a temporary config on a free loopback port; stop its process group afterwards."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        raise RuntimeError("nginx is not installed (apt-get install nginx-light)")
    folder.mkdir(parents=True, exist_ok=True)
    for d in TEMP_DIRS:
        (folder / d).mkdir(exist_ok=True)
    port = free_port()
    conf = folder / "nginx.conf"
    conf.write_text(render(site, port, folder))
    log = folder / "stderr.log"
    proc = spawn([binary, "-c", str(conf), "-e", str(folder / "error.log")], log)
    try:
        _wait_listening(port, proc, folder / "error.log")
        yield RunningNginx(port, proc, folder)
    finally:
        stop(proc)
