"""What `ncpsim status` adds to the status contract: the stack's state as it is now, not as it came up.

The contract's keys (clusters/stack.py `build_status`) say where things are; these say what they are doing:
each component's process, the function pods (workers), the faults in force, the values a user set (with
their origins) and the frontend certificate the proxy serves. Added keys only: the contract never changes.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from certs import inspect
from certs.store import CertStore
from clusters.stack import Stack
from scenarios import origins
from sim.model.topology import Topology
from sim.model.values import proxy_settings
from sim.runtime.links import FAULTS_FILE

Json = dict[str, Any]


def live(stack: Stack, running: dict[str, int] | None) -> Json:
    """The added keys for a stack whose topology can be read; nothing when it cannot (a start cut short)."""
    try:
        topology = stack.topology
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    state = stack.state_dir
    return {
        "components": components(running or {}),
        "workers": workers(topology),
        "faults": faults(state),
        "values": [v.to_json() for v in origins.effective(topology.values, origins.load(state))],
        "frontend": frontend(topology, state),
    }


def components(running: dict[str, int]) -> dict[str, Json]:
    """Each running component's pid, uptime and the real ports it listens on (what `ss -ltnup` would show)."""
    found: dict[str, Json] = {}
    now = time.time()
    sockets = machine_sockets()
    children = _children_of() if running else {}
    for name, pid in sorted(running.items()):
        entry: Json = {"pid": pid, "uptimeSeconds": None, "ports": []}
        try:
            process = psutil.Process(pid)
            entry["uptimeSeconds"] = round(now - process.create_time(), 1)
            tree = [pid, *_descendants(pid, children)]  # nats-server runs under its supervisor
            entry["ports"] = sorted(_listening(tree, sockets))
        except (psutil.Error, OSError):
            pass  # gone between the pid file and now: the pid says which it was
        found[name] = entry
    return found


# /proc/net/{tcp,udp}[6]'s `st` column: a TCP socket in LISTEN; a UDP socket bound and not connected (`ss`'s
# UNCONN). A connected UDP socket (a QUIC client's) listens on nothing, as `ss -lu` agrees.
LISTEN, UNCONNECTED = "0A", "07"
TABLES = (("tcp", "tcp"), ("tcp6", "tcp"), ("udp", "udp"), ("udp6", "udp"))


def listening_sockets(table: str, proto: str) -> dict[str, str]:
    """Socket inode -> "port/proto" for the listening sockets of one /proc/net table's text."""
    wanted = LISTEN if proto == "tcp" else UNCONNECTED
    found = {}
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9 and fields[3] == wanted:
            found[fields[9]] = f"{int(fields[1].rsplit(':', 1)[1], 16)}/{proto}"
    return found


def machine_sockets() -> dict[str, str] | None:
    """The machine's listening sockets by inode, each table read once; None where there is no /proc/net
    (macOS): psutil then asks process by process. psutil's own per-process call parses all four tables
    again for every process, which made `ncpsim status` take a quarter of a second."""
    found: dict[str, str] = {}
    for name, proto in TABLES:
        try:
            found.update(listening_sockets((Path("/proc/net") / name).read_text(), proto))
        except FileNotFoundError:
            if name == "tcp":
                return None
    return found


def _children_of() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for process in psutil.process_iter(["ppid"]):
        children.setdefault(process.info["ppid"] or 0, []).append(process.pid)
    return children


def _descendants(pid: int, children: dict[int, list[int]]) -> list[int]:
    found, todo = [], list(children.get(pid, []))
    while todo:
        found.append(child := todo.pop())
        todo += children.get(child, [])
    return found


def _listening(pids: list[int], sockets: dict[str, str] | None) -> set[str]:
    if sockets is not None:
        return {sockets[inode] for pid in pids for inode in _socket_inodes(pid) if inode in sockets}
    ports = set()
    for pid in pids:  # no /proc/net: psutil, process by process
        try:
            connections = psutil.Process(pid).net_connections(kind="inet")
        except (psutil.Error, OSError):
            continue
        for conn in connections:
            udp = conn.type == 2  # SOCK_DGRAM: a bound UDP socket has no state
            if conn.laddr and (udp and not conn.raddr or conn.status == psutil.CONN_LISTEN):
                ports.add(f"{conn.laddr.port}/{'udp' if udp else 'tcp'}")
    return ports


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets a process holds, from its descriptors' links ("socket:[12345]")."""
    fds = Path("/proc") / str(pid) / "fd"
    inodes: set[str] = set()
    try:
        names = os.listdir(fds)
    except OSError:
        return inodes  # gone, or not ours to read
    for fd in names:
        try:
            link = os.readlink(fds / fd)
        except OSError:
            continue  # closed while we looked
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def workers(topology: Topology) -> list[Json]:
    return [
        {
            "name": w.name,
            "cluster": w.cluster,
            "workerUtils": w.worker_utils,
            "trust": w.trust,
            "createdBeforePem": w.created_before_pem,
        }
        for w in topology.workers
    ]


def faults(state: Path) -> Json:
    """The link faults in force, as `ncpsim fault link` or a scenario step wrote them."""
    try:
        raw = json.loads((state / FAULTS_FILE).read_text())
    except (OSError, ValueError):
        return {"links": []}
    return {"links": list(raw.get("links") or [])}


def frontend(topology: Topology, state: Path) -> Json | None:
    """The certificate the proxy's frontend Secret holds: names, issuer, expiry (None when the proxy is off)."""
    settings = proxy_settings(topology.values)
    if not settings.enabled:
        return None
    store = CertStore(state / "certs")
    path = store.secret_dir(settings.frontend_secret) / "tls.crt"
    try:
        pem = path.read_bytes()
        names, not_after = inspect.sans(pem), inspect.not_after(pem)
    except (OSError, ValueError):
        return {"secret": settings.frontend_secret, "certificate": None}
    return {
        "secret": settings.frontend_secret,
        "names": names,
        "issuer": store.issuer_of(pem),
        "notAfter": not_after.isoformat(),
        "expired": not_after <= datetime.now(UTC),
    }


def text(extra: Json) -> list[str]:
    """The added facts as `ncpsim status` prints them under the endpoints."""
    lines = []
    front = extra.get("frontend")
    if front and front.get("names"):
        state = "EXPIRED" if front["expired"] else f"until {front['notAfter'][:10]}"
        lines.append(
            f"  frontend cert  Secret {front['secret']}: {', '.join(front['names'])} ({front['issuer']}, {state})"
        )
    for link in (extra.get("faults") or {}).get("links", []):
        what = ", ".join(f"{k} {v}" for k, v in link.items() if k not in ("source", "target"))
        lines.append(f"  fault          link {link.get('source')} -> {link.get('target')}: {what}")
    for value in extra.get("values") or []:
        lines.append(f"  value          {origins.Value(value['key'], value['value'], value['from']).text()}")
    grouped: dict[tuple[str, str, bool], int] = {}
    for w in extra.get("workers") or []:
        key = (w["workerUtils"], w["trust"], w["createdBeforePem"])
        grouped[key] = grouped.get(key, 0) + 1
    for (version, trust, before), count in grouped.items():
        late = ", created before the PEM" if before else ""
        lines.append(f"  workers        {count} x worker-utils {version}, trusts {trust}{late}")
    for name, entry in (extra.get("components") or {}).items():
        up = f"up {entry['uptimeSeconds']:.0f} s" if entry.get("uptimeSeconds") is not None else "gone"
        ports = " ".join(entry["ports"])  # none for a component that only dials (the worker hosts)
        lines.append(f"  process        {name:<26} pid {entry['pid']:<7} {up:<10} {ports}".rstrip())
    return lines
