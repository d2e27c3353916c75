"""What `ncpsim status` adds to the status contract: the stack's state as it is now, not as it came up.

The contract's keys (clusters/stack.py `build_status`) say where things are; these say what they are doing:
each component's process, the function pods (workers), the faults in force, the values a user set (with
their origins) and the frontend certificate the proxy serves. Added keys only: the contract never changes.
"""

from __future__ import annotations

import json
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
    """Each running component's pid, uptime and the real ports it listens on (what `ss -ltnp` would show)."""
    found: dict[str, Json] = {}
    now = time.time()
    for name, pid in sorted(running.items()):
        entry: Json = {"pid": pid, "uptimeSeconds": None, "ports": []}
        try:
            process = psutil.Process(pid)
            entry["uptimeSeconds"] = round(now - process.create_time(), 1)
            entry["ports"] = sorted(_listening(process))
        except (psutil.Error, OSError):
            pass  # gone between the pid file and now: the pid says which it was
        found[name] = entry
    return found


def _listening(process: psutil.Process) -> set[str]:
    ports = set()
    for each in [process, *process.children(recursive=True)]:  # nats-server runs under its supervisor
        try:
            connections = each.net_connections(kind="inet")
        except (psutil.Error, OSError):
            continue
        for conn in connections:
            udp = conn.type == 2  # SOCK_DGRAM: a bound UDP socket has no state
            if conn.laddr and (udp or conn.status == psutil.CONN_LISTEN):
                ports.add(f"{conn.laddr.port}/{'udp' if udp else 'tcp'}")
    return ports


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
        lines.append(f"  process        {name:<26} pid {entry['pid']:<7} {up:<10} {' '.join(entry['ports'])}")
    return lines
