"""The ready-to-paste commands `ncpsim up` and `ncpsim status` print: each fits the stack and works as pasted.

They name the stack when it is not the default one, trust the CA that actually signs the proxy's
frontend (the public-style CA for a public frontend), leave out what the stack does not have (no curl to
invocation pods when there are none, nothing through a proxy that is off) and show an HTTP/3 request
when a grpc-proxy pod exists (this curl may lack HTTP/3, so it uses ncpsim's own client).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from sim.model.topology import Topology
from sim.model.values import proxy_settings

DEFAULT_STACK = "default"
PROGRAMS = ("ncpsim", "invoke", "inv")


def invoke_program() -> str:
    """The program running now, as a user would type it: `ncpsim` (or `invoke`) when that is what PATH finds,
    `python -m invoke` when run so, else the path it was started as; `ncpsim` for anything else (a test)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).parent.name == "invoke" and Path(argv0).name == "__main__.py":
        return f"{python_program()} -m invoke"
    name = Path(argv0).name
    if name not in PROGRAMS:
        return "ncpsim"
    found = shutil.which(name)
    if found and Path(found).resolve() == Path(argv0).resolve():
        return name
    return shlex.quote(argv0)


def python_program() -> str:
    """This Python, relative to the working folder when it lives under it (`.venv/bin/python`)."""
    relative = os.path.relpath(sys.executable)
    return shlex.quote(sys.executable if relative.startswith("..") else relative)


def frontend_ca(status: dict[str, Any]) -> str:
    """PEM path of the CA that signs the proxy's frontend certificate, as the stack runs now."""
    state = Path(status["stateDir"])
    try:
        topology = Topology.load(state)
    except (OSError, ValueError, KeyError, TypeError):
        return str(status["ca"]["stack"])
    settings = proxy_settings(topology.values)
    declared = {s.name: s for s in getattr(topology, "secrets", ())}
    secret = declared.get(settings.frontend_secret)
    if secret is not None and getattr(secret, "source", None):
        bundled = Path(secret.source) / "ca.crt"
        if bundled.exists():
            return str(bundled)
    issuer = secret.issuer if secret is not None else settings.frontend_issuer
    return str(status["ca"].get(issuer) or state / "certs" / "ca" / issuer / "ca.crt")


def _flags(status: dict[str, Any]) -> str:
    flags = "" if status["stack"] == DEFAULT_STACK else f" --stack {shlex.quote(status['stack'])}"
    return flags + ("" if status.get("backend", "local") == "local" else f" --backend {status['backend']}")


def _pods(status: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [p for p in status["pods"] if p["role"] == role]


def proxy_commands(status: dict[str, Any]) -> list[str]:
    """curl, openssl s_client and an HTTP/3 request through the proxy's fronts (none when it is off)."""
    proxy = status.get("proxy") or {}  # null when the proxy is off
    http, h3 = proxy.get("http") or {}, proxy.get("h3") or {}
    wd, ca = status["workerDomain"], shlex.quote(frontend_ca(status))
    name = http.get("name") or f"invocation.{wd}"  # global.workerEndpoints.invocationProxyURL's host if set
    lines = []
    invocation = _pods(status, "invocation")
    if http.get("port") and invocation:
        front = f"{name}:{http['port']}"
        target = f"{invocation[0]['target']}/v2/nvcf/worker/request-attach"
        lines.append(
            f"curl -sv --proxy https://{front} --proxy-cacert {ca} \\\n"
            f"       --resolve {front}:{http['host']} {target}   # the pod answers 401: no token"
        )
    if http.get("port"):
        lines.append(
            f"openssl s_client -connect {http['host']}:{http['port']} -servername {name} "
            f"-CAfile {ca} -verify_return_error </dev/null   # the frontend certificate, verified"
        )
    grpc = _pods(status, "grpc-proxy")
    if h3.get("port") and grpc:
        host = f"{grpc[0]['ip'].replace('.', '-')}.{wd}"
        lines.append(
            f"{python_program()} -m scenarios.h3get https://{host}/v1/proxy \\\n"
            f"       --connect {h3['host']}:{h3['port']} --cacert {ca}   # HTTP/3: 401 from grpc-proxy"
        )
    return lines


def dns_command(status: dict[str, Any]) -> list[str]:
    """A lookup as a worker's cluster makes it: a compute cluster's view if there is one."""
    views = status["dns"]
    compute = [name for name in views if name != "ncpsim-cp"]
    view = views[compute[0]] if compute else views.get("ncpsim-cp")
    if not view or not view.get("port") or not status["pods"]:
        return []
    pod = (_pods(status, "grpc-proxy") or status["pods"])[0]
    # A compute cluster rewrites *.<workerDomain> to the proxy; the control plane answers pod names.
    name = f"{pod['ip'].replace('.', '-')}.{status['workerDomain']}" if compute else _pod_name(pod)
    return [f"dig @{view['host']} -p {view['port']} +short {name}"]


def _pod_name(pod: dict[str, Any]) -> str:
    target = str(pod.get("target", ""))
    host = target.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
    return (
        host
        if pod["role"] == "invocation"
        else f"{pod['ip'].replace('.', '-')}.grpc-headless.nvcf.svc.cluster.local"
    )


def nats_command(status: dict[str, Any]) -> list[str]:
    """nats-server's monitoring endpoint, as it is: version, connections, JetStream (none if unpublished)."""
    monitor = (status.get("nats") or {}).get("monitor")
    # nats-server's monitor answers anyone on the machine, without credentials, as the real one does
    line = f"curl -s {monitor}/varz   # nats-server: version, connections, JetStream (no auth, as upstream)"
    return [line] if monitor else []


def _home() -> str:
    """`NCPSIM_HOME=... ` when it is set: a command pasted in another shell must find the same stacks."""
    home = os.environ.get("NCPSIM_HOME")
    return f"NCPSIM_HOME={shlex.quote(str(Path(home).expanduser().resolve()))} " if home else ""


def invoke_commands(status: dict[str, Any]) -> list[str]:
    """The dev-environment tasks, with the flags that point them at this stack."""
    program, flags = _home() + invoke_program(), _flags(status)
    lines = []
    if _pods(status, "invocation"):
        lines.append(f"{program} call http-echo --count 3{flags}")
    elif _pods(status, "grpc-proxy"):
        lines.append(f"{program} call grpc-echo --count 3{flags}")
    proxied = bool(((status.get("proxy") or {}).get("http") or {}).get("port"))
    lines.append(f"{program} logs {'worker-callback-proxy.access' if proxied else 'all'}{flags}")
    lines += [f"{program} status --json{flags}", f"{program} down{flags}"]
    return lines


def try_commands(status: dict[str, Any]) -> list[str]:
    """Every command, in an order that works when all are pasted at once (`ncpsim down` last)."""
    return [*proxy_commands(status), *dns_command(status), *nats_command(status), *invoke_commands(status)]
