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
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"


class Unreachable(OSError):
    """No route from the caller's cluster to that address (as EHOSTUNREACH / a silent drop would be)."""


class Refused(ConnectionRefusedError):
    """Routable, but nothing listens there."""


def key(ip: str, port: int, proto: str = "tcp") -> str:
    return f"{ip}:{port}/{proto}"


@dataclass
class NetMap:
    bindings: dict[str, int] = field(default_factory=dict)  # "ip:port/proto" -> real loopback port
    reach: dict[str, list[str]] = field(default_factory=dict)  # cluster -> routable CIDRs

    def routable(self, cluster: str, ip: str) -> bool:
        addr = ipaddress.ip_address(ip)
        return any(addr in ipaddress.ip_network(cidr) for cidr in self.reach.get(cluster, ()))

    def lookup(self, cluster: str, ip: str, port: int, proto: str = "tcp") -> tuple[str, int]:
        """Real (host, port) for a virtual address as seen from `cluster`."""
        if not self.routable(cluster, ip):
            raise Unreachable(f"no route to host {ip} from cluster {cluster}")
        real = self.bindings.get(key(ip, port, proto))
        if real is None:
            raise Refused(f"connection refused: {ip}:{port}/{proto}")
        return LOOPBACK, real

    def reverse(self, real_port: int, proto: str = "tcp") -> str | None:
        """The virtual ip:port behind a real port (for logs)."""
        for k, v in self.bindings.items():
            if v == real_port and k.endswith("/" + proto):
                return k.rsplit("/", 1)[0]
        return None

    def to_json(self) -> str:
        return json.dumps({"bindings": self.bindings, "reach": self.reach}, indent=2, sort_keys=True)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)  # readers never see half a map


class LiveNetMap:
    """A NetMap that follows its file: re-read whenever the file's mtime changes."""

    def __init__(self, path: Path):
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._map = NetMap()

    def current(self) -> NetMap:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return self._map
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp != self._stamp:
            raw = json.loads(self.path.read_text())
            self._map = NetMap(bindings=raw["bindings"], reach=raw["reach"])
            self._stamp = stamp
        return self._map

    def lookup(self, cluster: str, ip: str, port: int, proto: str = "tcp") -> tuple[str, int]:
        return self.current().lookup(cluster, ip, port, proto)
