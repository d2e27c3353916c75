"""`invoke doctor`: what this laptop has and lacks for each backend, with the fix for each gap.

The local backend needs Python 3.11+, its packages and loopback sockets (port 0, so no fixed port can
clash). The k3d backend needs docker, k3d, kubectl, a reachable engine, and the host ports its load
balancer publishes for the proxy.
"""

from __future__ import annotations

import errno
import importlib.util
import socket
import sys
from collections.abc import Callable

from clusters.k3d.engine import DockerEngine, SdkEngine
from clusters.k3d.preflight import Check, k3d_checks
from clusters.k3d.runner import CommandRunner
from clusters.render.layout import H3_HOST_PORT, HTTP_HOST_PORT

LOCAL_MODULES = ("aioquic", "dnslib", "h11", "h2", "trustme", "cryptography", "yaml", "invoke")


def python_check() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info >= (3, 11)
    return Check("python", ok, version, "" if ok else "install Python 3.11 or later (pyenv, uv or your OS)")


def modules_check() -> Check:
    missing = [name for name in LOCAL_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        return Check(
            "python packages",
            False,
            f"missing {', '.join(missing)}",
            "pip install -e '.[test]' in the repository's virtualenv",
        )
    return Check("python packages", True, "all present")


def loopback_check() -> Check:
    try:
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(socket.AF_INET, kind) as sock:
                sock.bind(("127.0.0.1", 0))
    except OSError as exc:
        return Check(
            "loopback sockets", False, str(exc), "allow binding 127.0.0.1 (sandbox or firewall settings)"
        )
    return Check("loopback sockets", True, "127.0.0.1, port 0 (nothing fixed to clash)")


def port_check(port: int, kind: int, label: str) -> Check:
    name = f"host port {port}/{label}"
    try:
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.bind(("0.0.0.0", port))
    except OSError as exc:
        if exc.errno == errno.EACCES:
            return Check(
                name,
                True,
                "privileged: a rootful Docker engine binds it; rootless Docker needs "
                f"`sysctl net.ipv4.ip_unprivileged_port_start={port}`",
            )
        if exc.errno == errno.EADDRINUSE:
            return Check(
                name, False, "in use", f"stop what listens there (`lsof -i :{port}`) or free the port"
            )
        return Check(name, False, str(exc), "check local firewall settings")
    return Check(name, True, "free")


def local_checks() -> list[Check]:
    return [python_check(), modules_check(), loopback_check()]


def k3d_section(runner: CommandRunner, engine: DockerEngine) -> list[Check]:
    return [
        *k3d_checks(runner, engine),
        port_check(HTTP_HOST_PORT, socket.SOCK_STREAM, "tcp"),
        port_check(H3_HOST_PORT, socket.SOCK_DGRAM, "udp"),
    ]


def report(sections: dict[str, list[Check]], out: Callable[[str], None] = print) -> None:
    for backend, checks in sections.items():
        ready = all(c.ok for c in checks)
        out(f"{backend} backend: {'ready' if ready else 'not ready'}")
        for check in checks:
            out(check.line())


def doctor(
    runner: CommandRunner | None = None,
    engine: DockerEngine | None = None,
    out: Callable[[str], None] = print,
) -> int:
    """Print both backends' checks; 0 when the local backend is ready (k3d is optional), else 1."""
    runner = runner or CommandRunner(echo=None)
    sections = {"local": local_checks(), "k3d": k3d_section(runner, engine or SdkEngine())}
    report(sections, out)
    return 0 if all(c.ok for c in sections["local"]) else 1
