"""Publish a component's loopback listeners on the pod's own ports.

The stand-in components bind 127.0.0.1 port 0 and report ``{"<virtual ip>:<port>/<proto>": real}``
(their contract with the local launcher). In a pod, the cluster must reach them on the real port
numbers, so each binding gets a relay on 0.0.0.0:<port> that moves bytes (TCP) or datagrams (UDP, so
QUIC passes through untouched) to the loopback port. TLS and QUIC stay end to end with the component.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from functools import partial

LOOPBACK = "127.0.0.1"
CHUNK = 65536
UDP_IDLE = 300.0  # forget a UDP peer after this long without datagrams (QUIC's idle timeout is shorter)


def parse_binding(key: str) -> tuple[int, str]:
    """ "10.42.0.11:8443/tcp" -> (8443, "tcp")."""
    address, _, proto = key.rpartition("/")
    return int(address.rpartition(":")[2]), proto


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # half-close, so the far side sees the end of the request
    except (ConnectionError, OSError):
        pass


async def tcp_relay(port: int, target: int, host: str = "0.0.0.0") -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, target)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()

    return await asyncio.start_server(handle, host, port)


class _Upstream(asyncio.DatagramProtocol):
    """The relay's socket towards the component for one downstream peer."""

    def __init__(self, relay: UdpRelay, peer: tuple[str, int]):
        self.relay, self.peer = relay, peer
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.relay.reply(data, self.peer)


@dataclass
class _Peer:
    upstream: _Upstream
    seen: float
    pending: list[bytes] = field(default_factory=list)  # datagrams that arrived before the socket opened


@dataclass
class UdpRelay(asyncio.DatagramProtocol):
    """One listening socket; one upstream socket per downstream peer, so replies find their way back."""

    target: int
    transport: asyncio.DatagramTransport | None = None
    peers: dict[tuple[str, int], _Peer] = field(default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        loop = asyncio.get_running_loop()
        peer = self.peers.get(addr)
        if peer is None:
            peer = self.peers[addr] = _Peer(_Upstream(self, addr), loop.time())
            task = loop.create_task(self._open(peer), name=f"udp-relay:{addr[0]}:{addr[1]}")
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        peer.seen = loop.time()
        if peer.upstream.transport is None:
            peer.pending.append(data)
        else:
            peer.upstream.transport.sendto(data)
        self._expire(peer.seen)

    async def _open(self, peer: _Peer) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: peer.upstream, remote_addr=(LOOPBACK, self.target))
        if peer.upstream.transport is not None:
            for data in peer.pending:
                peer.upstream.transport.sendto(data)
        peer.pending.clear()

    def reply(self, data: bytes, peer: tuple[str, int]) -> None:
        if self.transport is not None:
            self.transport.sendto(data, peer)

    def _expire(self, now: float) -> None:
        for addr, peer in list(self.peers.items()):
            if now - peer.seen > UDP_IDLE and peer.upstream.transport is not None:
                peer.upstream.transport.close()
                del self.peers[addr]

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for peer in self.peers.values():
            if peer.upstream.transport is not None:
                peer.upstream.transport.close()
        if self.transport is not None:
            self.transport.close()


@dataclass
class Published:
    servers: list[asyncio.Server] = field(default_factory=list)
    udp: list[UdpRelay] = field(default_factory=list)

    def close(self) -> None:
        for server in self.servers:
            server.close()
        for relay in self.udp:
            with contextlib.suppress(Exception):
                relay.close()


async def publish(bindings: dict[str, int], host: str = "0.0.0.0") -> Published:
    published = Published()
    loop = asyncio.get_running_loop()
    for key, real in sorted(bindings.items()):
        port, proto = parse_binding(key)
        if proto == "udp":
            _, relay = await loop.create_datagram_endpoint(partial(UdpRelay, real), local_addr=(host, port))
            published.udp.append(relay)
        else:
            published.servers.append(await tcp_relay(port, real, host))
    return published
