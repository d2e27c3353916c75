"""The virtual network: which real loopback port stands for which virtual ip:port, and who may route where.

Components never dial a virtual address. They ask the map, from the cluster they live in, and get a
real 127.0.0.1 port, or the error an unreachable network or a closed port would give. The map lives
in the state folder (written by the launcher once components have bound their ports) and is re-read
when it changes, so a restarted pod on a new port is found without restarting its peers.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"


class Unreachable(OSError):
    """No route from the caller's cluster to that address (as EHOSTUNREACH / a silent drop would be)."""


class Refused(ConnectionRefusedError):
    """Routable, but nothing listens there."""


ROUTES_REMEMBERED = 4096


def key(ip: str, port: int, proto: str = "tcp") -> str:
    return f"{ip}:{port}/{proto}"


@dataclass
class NetMap:
    bindings: dict[str, int] = field(default_factory=dict)  # "ip:port/proto" -> real loopback port
    reach: dict[str, list[str]] = field(default_factory=dict)  # cluster -> routable CIDRs
    # A Service address ("10.43.0.20:8080/tcp") -> its endpoints' keys; each connection picks one, as
    # kube-proxy does, so two connections to one Service may reach different pods.
    services: dict[str, list[str]] = field(default_factory=dict)
    pickers: dict[str, random.Random] = field(default_factory=dict, repr=False, compare=False)
    seed: int = 0
    # (cluster, ip) -> routable: every connection asks, and parsing the CIDRs each time showed in profiles
    routes: dict[tuple[str, str], bool] = field(default_factory=dict, repr=False, compare=False)

    def routable(self, cluster: str, ip: str) -> bool:
        known = self.routes.get((cluster, ip))
        if known is None:
            addr = ipaddress.ip_address(ip)
            known = any(addr in ipaddress.ip_network(cidr) for cidr in self.reach.get(cluster, ()))
            if len(self.routes) < ROUTES_REMEMBERED:  # names from the wire are many; the stack's are few
                self.routes[cluster, ip] = known
        return known

    def lookup(self, cluster: str, ip: str, port: int, proto: str = "tcp") -> tuple[str, int]:
        """Real (host, port) for a virtual address as seen from `cluster`."""
        if not self.routable(cluster, ip):
            raise Unreachable(f"no route to host {ip} from cluster {cluster}")
        virtual = key(ip, port, proto)
        real = self.bindings.get(virtual)
        if real is None and virtual in self.services:
            real = self.bindings.get(self.endpoint(cluster, virtual) or "")
        if real is None:
            raise Refused(f"connection refused: {ip}:{port}/{proto}")
        return LOOPBACK, real

    def lookup_all(self, cluster: str, ip: str, port: int, proto: str = "tcp") -> list[tuple[str, int]]:
        """Every real (host, port) behind a virtual address as seen from `cluster`: a Service's bound
        endpoints in their order, or the one binding; for a client that keeps a list of servers."""
        if not self.routable(cluster, ip):
            raise Unreachable(f"no route to host {ip} from cluster {cluster}")
        virtual = key(ip, port, proto)
        endpoints = self.services.get(virtual, [virtual])
        real = [self.bindings[e] for e in endpoints if e in self.bindings]
        if not real:
            raise Refused(f"connection refused: {ip}:{port}/{proto}")
        return [(LOOPBACK, p) for p in real]

    def endpoint(self, cluster: str, service: str) -> str | None:
        """A bound endpoint of a Service, from a seeded generator per caller's cluster (replays repeat)."""
        live = [e for e in self.services[service] if e in self.bindings]
        if not live:
            return None
        picker = self.pickers.setdefault(cluster, random.Random(f"{self.seed}:{cluster}"))
        return picker.choice(live)

    def to_json(self) -> str:
        raw: dict[str, object] = {"bindings": self.bindings, "reach": self.reach}
        if self.services:
            raw.update(services=self.services, seed=self.seed)
        return json.dumps(raw, indent=2, sort_keys=True)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)  # a link planted at the temporary name is removed, never written through
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(self.to_json())
        os.replace(tmp, path)  # readers never see half a map; replacing a link replaces the link itself


class LiveNetMap:
    """A NetMap that follows its file: re-read whenever the file's mtime changes."""

    def __init__(self, path: Path):
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._map = NetMap()
        self._pickers: dict[str, random.Random] = {}  # kept across re-reads: the sequence goes on

    def current(self) -> NetMap:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return self._map
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp != self._stamp:
            raw = json.loads(self.path.read_text())
            services, seed = raw.get("services"), raw.get("seed", 0)
            if services is None:
                services, seed = _topology_services(self.path.parent)
            self._map = NetMap(
                bindings=raw["bindings"],
                reach=raw["reach"],
                services=services,
                pickers=self._pickers,
                seed=seed,
            )
            self._stamp = stamp
        return self._map

    def lookup(self, cluster: str, ip: str, port: int, proto: str = "tcp") -> tuple[str, int]:
        return self.current().lookup(cluster, ip, port, proto)


def _topology_services(state_dir: Path) -> tuple[dict[str, list[str]], int]:
    """Service addresses from the stack's topology.json, for network maps written without them."""
    from sim.model.topology import Topology

    try:
        topology = Topology.load(state_dir)
    except (OSError, ValueError, KeyError):
        return {}, 0
    return topology.service_endpoints(), topology.seed
