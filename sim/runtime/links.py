"""Link faults: which of a cluster's dials, queries and datagrams a faulty link touches, and how (pure), and
<state>/faults.json, where a fault step writes them and every component's Context reads them.

A link fault acts where the simulated network would: between a cluster and an address range, on TCP
(each dial, and each request a kept-alive connection carries), on UDP (each DNS query, each QUIC
datagram) or on both, so a firewall or a load balancer that forwards TCP only can be expressed.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import random
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FAULTS_FILE = "faults.json"


TCP, UDP, ANY = "tcp", "udp", "any"
PROTOCOLS = (TCP, UDP, ANY)  # what a link fault touches: a firewall or a TCP-only load balancer drops udp


@dataclass(frozen=True)
class LinkFault:
    source: str  # cluster whose dials are affected, e.g. "ncpsim-compute-1"
    target: str  # virtual IP or CIDR the dials go to, e.g. "10.100.0.10" (the proxy's LB)
    latency_ms: int = 0
    # TCP: the share of connection attempts (and of requests on kept-alive connections) lost; UDP: the
    # share of datagrams lost (a DNS query is one).
    drop: float = 0.0
    timeout_ms: int = 1000  # how long a lost attempt (a TCP dial, a DNS query, a QUIC handshake) hangs
    protocol: str = ANY  # "tcp" | "udp" | "any"

    def applies(self, cluster: str, ip: str, protocol: str) -> bool:
        return cluster == self.source and self.protocol in (ANY, protocol) and _within(ip, self.target)


@functools.lru_cache(maxsize=1024)
def _within(ip: str, target: str) -> bool:
    """Asked for each datagram a cluster sends while a fault of its is in force: parse each pair once."""
    return ipaddress.ip_address(ip) in ipaddress.ip_network(target)


@dataclass
class LinkState:
    """What components read: the link faults in force (hot-reloaded by mtime)."""

    links: list[LinkFault] = field(default_factory=list)

    def matching(self, cluster: str, ip: str, protocol: str) -> LinkFault | None:
        """The first fault on the link from `cluster` to `ip` that touches `protocol` ("tcp" or "udp")."""
        return next((f for f in self.links if f.applies(cluster, ip, protocol)), None)


NO_LINKS = LinkState()


def load_links(state_dir: Path, cache: dict[str, Any]) -> LinkState:
    """The faults in force; asked before every dial, lookup, kept-alive request and QUIC datagram, so one
    stat when nothing changed (no pathlib, no new objects)."""
    path = cache.get("path") or cache.setdefault("path", os.path.join(state_dir, FAULTS_FILE))
    try:
        stamp = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return NO_LINKS
    if cache.get("stamp") != stamp:
        raw = json.loads(Path(path).read_text())
        cache.update(stamp=stamp, state=LinkState([LinkFault(**link) for link in raw.get("links", [])]))
    state: LinkState = cache["state"]
    return state


def save_links(state_dir: Path, links: list[LinkFault]) -> None:
    # A name of its own per writer (O_EXCL, no link followed): two `ncpsim fault link` at once no longer
    # replace each other's temporary file away (FileNotFoundError, a traceback).
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=f".{FAULTS_FILE}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps({"links": [asdict(link) for link in links]}, indent=2))
    os.replace(tmp, state_dir / FAULTS_FILE)


def link_delay(fault: LinkFault | None, rng: random.Random) -> tuple[float, bool]:
    """(seconds to wait, dropped?) for one dial over a faulty link (pure)."""
    if fault is None:
        return 0.0, False
    if fault.drop and rng.random() < fault.drop:
        return fault.timeout_ms / 1000, True
    return fault.latency_ms / 1000, False


def datagram_delay(fault: LinkFault | None, rng: random.Random) -> float | None:
    """Seconds one datagram is held back on a faulty link, or None: it is lost (pure). No timeout of its
    own: the protocol above (QUIC's loss recovery and timeouts) finds out, as it would in the field."""
    if fault is None:
        return 0.0
    if fault.drop and rng.random() < fault.drop:
        return None
    return fault.latency_ms / 1000


def attempt_timeout(fault: LinkFault | None, default: float) -> float:
    """How long a QUIC handshake over this link waits: the link's timeoutMs where it loses packets, as a
    lost TCP dial hangs that long, else the dialer's own `default` (pure)."""
    return fault.timeout_ms / 1000 if fault is not None and fault.drop else default
