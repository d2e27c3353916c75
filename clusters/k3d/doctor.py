"""`ncpsim doctor`: what this laptop has and lacks for each backend, with the fix for each gap.

The local backend needs Python 3.11+, its packages and loopback sockets (port 0, so no fixed port can
clash). The k3d backend needs docker, k3d, kubectl, a reachable engine, and the host ports its load
balancer publishes for the proxy.
"""

from __future__ import annotations

import errno
import importlib.util
import shutil
import socket
import sys
from collections.abc import Callable

from clusters.k3d.engine import DockerEngine, SdkEngine
from clusters.k3d.preflight import Check, k3d_checks
from clusters.k3d.runner import CommandRunner
from clusters.render.layout import H3_HOST_PORT, HTTP_HOST_PORT

LOCAL_MODULES = ("aioquic", "dnslib", "h11", "h2", "trustme", "cryptography", "yaml", "invoke")
# The real clients and peers the tests and `ncpsim bench` use beside ncpsim: (tool, Debian package, what for).
CLIENTS = (
    ("curl", "curl", "the tests' and printed commands' HTTP client"),
    ("openssl", "openssl", "the tests' and printed commands' TLS client"),
    ("dig", "bind9-dnsutils", "the tests' and printed commands' DNS client"),
    ("chromium", "chromium", "the sequence diagram's browser test"),
    ("nginx", "nginx", "`ncpsim bench`'s relay peer"),
    ("dnsmasq", "dnsmasq", "`ncpsim bench`'s DNS peer"),
)


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


def client_checks(which: Callable[[str], str | None] = shutil.which) -> list[Check]:
    """The tools the tests and bench use; a missing one skips what needs it, never the backend."""
    checks = []
    for tool, package, purpose in CLIENTS:
        found = which(tool)
        fix = f"apt-get install {package} (macOS: brew install {tool}); {purpose}"
        checks.append(Check(tool, bool(found), found or "not found", "" if found else fix))
    return checks


def k3d_section(runner: CommandRunner, engine: DockerEngine) -> list[Check]:
    return [
        *k3d_checks(runner, engine),
        port_check(HTTP_HOST_PORT, socket.SOCK_STREAM, "tcp"),
        port_check(H3_HOST_PORT, socket.SOCK_DGRAM, "udp"),
    ]


def report(sections: dict[str, list[Check]], out: Callable[[str], None] = print) -> None:
    for section, checks in sections.items():
        ready = all(c.ok for c in checks)
        if section == CLIENTS_SECTION:
            out(f"{section}: {'all present' if ready else 'some missing (what needs them is skipped)'}")
        else:
            out(f"{section} backend: {'ready' if ready else 'not ready'}")
        for check in checks:
            out(check.line())


CLIENTS_SECTION = "clients and peers (tests, bench)"


def doctor(
    runner: CommandRunner | None = None,
    engine: DockerEngine | None = None,
    out: Callable[[str], None] = print,
    backend: str = "local",
) -> int:
    """Print both backends' checks and the clients'; 0 when `backend` (local, k3d or all) is ready, else 1."""
    runner = runner or CommandRunner(echo=None)
    sections = {
        "local": local_checks(),
        "k3d": k3d_section(runner, engine or SdkEngine()),
        CLIENTS_SECTION: client_checks(),
    }
    report(sections, out)
    judged = ("local", "k3d") if backend == "all" else (backend,)
    return 0 if all(c.ok for name in judged for c in sections[name]) else 1
