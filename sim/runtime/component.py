"""What every component process gets: its place in the topology and the network as its cluster sees it."""

from __future__ import annotations

import asyncio
import random
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dns.client import NameNotResolved, resolve_a
from sim.model.events import EventLog
from sim.model.netmap import LiveNetMap, Refused
from sim.model.topology import Topology
from sim.protocols.dial import StreamProtocol, open_within
from sim.runtime.links import TCP, UDP, LinkFault, datagram_delay, link_delay, load_links
from sim.wire import DNS_PORT, NATS_PORT

# A component reports the virtual addresses it serves: {"10.42.0.11:8443/tcp": 40123, ...}
Ready = Callable[[dict[str, int]], None]
Runner = Callable[["Context", Ready], Coroutine[Any, Any, None]]  # a component's `async def run`

CONNECT_TIMEOUT = 5.0


@dataclass
class Context:
    state_dir: Path
    topology: Topology
    name: str  # component name, e.g. "invocation-service-0", "worker-callback-proxy", "ncpsim-compute-1"
    cluster: str
    events: EventLog = field(init=False)
    netmap: LiveNetMap = field(init=False)
    _links: dict = field(init=False, default_factory=dict)  # cache of <state>/faults.json
    _rng: random.Random = field(init=False)
    # Datagrams draw from their own stream: how many a QUIC connection sends depends on timing, and must
    # not shift the draws of dials and queries, which a replay repeats.
    _datagram_rng: random.Random = field(init=False)
    # Seed for what a pod mints (request ids, tokens): the same on a stack's first start, so a replay is
    # reproducible; another one for a restarted process (its events file was no longer empty when it
    # opened it), so a restarted pod never hands out a request id its predecessor already used.
    mint_seed: str = field(init=False)

    def __post_init__(self) -> None:
        self.events = EventLog(self.state_dir, self.name)
        earlier = self.events.written
        self.mint_seed = f"{self.topology.seed}:{self.name}" + (f":{earlier}" if earlier else "")
        self.netmap = LiveNetMap(self.state_dir / "netmap.json")
        self._rng = random.Random(f"{self.topology.seed}:{self.name}")
        self._datagram_rng = random.Random(f"{self.topology.seed}:{self.name}:datagrams")

    def link_fault(self, ip: str, protocol: str) -> LinkFault | None:
        """The link fault in force on this cluster's `protocol` traffic to `ip` (read anew when it changes)."""
        return load_links(self.state_dir, self._links).matching(self.cluster, ip, protocol)

    async def cross_link(self, ip: str, protocol: str = TCP) -> None:
        """Apply a link fault (latency, drop) on the way to `ip`, as the scenario configured it: on each dial
        and query, and on each request a kept-alive connection carries there."""
        wait, dropped = link_delay(self.link_fault(ip, protocol), self._rng)
        if wait:
            await asyncio.sleep(wait)  # the simulated link's delay
        if dropped:
            raise TimeoutError(f"connection to {ip} timed out (packets dropped on the link)")

    # Files -----------------------------------------------------------------------------------
    def secret(self, name: str) -> Path:
        return self.state_dir / "certs" / "secrets" / name

    def ca_path(self, issuer: str) -> Path:
        return self.state_dir / "certs" / "ca" / issuer / "ca.crt"

    @property
    def values(self) -> dict:
        return self.topology.values

    # Network, as this component's cluster sees it ---------------------------------------------
    def dns_server(self) -> tuple[str, int]:
        """The cluster DNS service address, mapped to the resolver's view for this cluster."""
        dns_ip = self.topology.cluster(self.cluster).dns_ip
        return self.netmap.lookup(self.cluster, dns_ip, DNS_PORT, "udp")

    async def resolve(self, name: str) -> list[str]:
        dns_ip = self.topology.cluster(self.cluster).dns_ip
        try:
            await self.cross_link(dns_ip, UDP)  # one query, one datagram
        except TimeoutError:
            raise NameNotResolved(name, "TIMEOUT") from None
        return await resolve_a(name, self.dns_server())

    async def open_tcp(
        self,
        ip: str,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        timeout: float = CONNECT_TIMEOUT,
        protocol: StreamProtocol | None = None,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, real = self.netmap.lookup(self.cluster, ip, port, "tcp")
        await self.cross_link(ip)
        return await open_within(host, real, timeout, tls, server_hostname, protocol)

    def udp_address(self, ip: str, port: int) -> tuple[str, int]:
        return self.netmap.lookup(self.cluster, ip, port, "udp")

    def datagram_fate(self, ip: str) -> Callable[[], float | None]:
        """Each datagram's fate on the way to `ip`: held back that many seconds, or lost (None), as the link
        faults in force say, asked per datagram (so a fault written later reaches a kept-alive connection).
        QUIC dials use it (sim.runtime.quic_dial), drawing from their own stream of randomness."""
        return lambda: datagram_delay(self.link_fault(ip, UDP), self._datagram_rng)

    def nats_url(self) -> str:
        """nats-server as this cluster reaches it: the control plane's load-balancer address, port 4222."""
        host, port = self.netmap.lookup(self.cluster, self.topology.bus_lb_ip, NATS_PORT, "tcp")
        return f"nats://{host}:{port}"

    def nats_servers(self, every: bool = False) -> list[str]:
        """The NATS servers as this cluster reaches them: each server behind the control plane's NATS load
        balancer (port 4222), in ordinal order, as a client's server list; a client fails over among them
        as it would among the load balancer's endpoints. Refused while none is bound (``every``: while one
        of the StatefulSet's servers has never been bound, at the stack's start)."""
        netmap = self.netmap.current()
        found = netmap.lookup_all(self.cluster, self.topology.bus_lb_ip, NATS_PORT, "tcp")
        if every and len(found) < len(self.topology.nats_servers):
            raise Refused(
                f"connection refused: {len(found)} of {len(self.topology.nats_servers)} NATS servers up"
            )
        return [f"nats://{host}:{port}" for host, port in found]

    def nats_sign_in_up(self) -> bool:
        """At a stack's start: every NATS server bound, and the auth callout up to sign clients in (it is up
        with the NVCF API's stand-in, at the API's Service, as the API that deploys workers is)."""
        try:
            self.nats_servers(every=True)
        except OSError:
            return False
        return self.topology.api_service.address in self.netmap.current().bindings


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def connection_handler(handler: Handler) -> Handler:
    """Let a connection handler end quietly when its server shuts down.

    Python 3.11's start_server reports a cancelled handler task as an error in the log; cancellation
    at shutdown is the normal end of a connection here.
    """

    async def wrapper(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except asyncio.CancelledError:
            writer.close()

    return wrapper
