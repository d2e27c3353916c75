"""The proxy's connections to pods: dialing one (TLS verified as Envoy's upstream validator would), and the
pool of idle ones shared by every worker connection, as Envoy's cluster connection pool is."""

from __future__ import annotations

import asyncio
import ssl
from typing import Protocol

import h11

from sim.model.netmap import Unreachable
from sim.protocols.dial import DrainAware
from sim.protocols.http1 import H11Stream
from sim.protocols.reads import HeadReader, buffered
from sim.protocols.tls import ReloadingContext
from sim.proxy.downstream import log
from sim.proxy.policy import Forward, RequestHead, expects_continue, upstream_reset
from sim.proxy.san import INVOCATION_UPSTREAM, peercert_dns_sans
from sim.runtime.component import Context
from sim.wire import UpstreamFailure

# Not sent on to the pod (Host is the pod's authority, and the framing fields are written again at the end).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-authorization",
        "transfer-encoding",
        "content-length",
        "host",
    }
)
HOP_BY_HOP_AND_EXPECT = HOP_BY_HOP | {"expect"}  # with Expect: 100-continue, which Envoy answered itself
# Envoy caps a cluster's connections (circuit breaker max_connections, 1024 by default), not its idle ones.
MAX_IDLE_PER_AUTHORITY = 1024


class PodSink(Protocol):
    """Who takes a pod connection's bytes while it relays an exchange in callbacks (sim.proxy.worker_connection)."""

    def pod_data(self, data: bytes) -> None: ...

    def pod_ended(self) -> None: ...


class PodProtocol(DrainAware):
    """A pod connection's protocol: its bytes go to its StreamReader, as asyncio's own protocol sends them, but
    to `sink` while a worker connection relays an exchange in callbacks. The end of the stream (and a reset)
    reaches the StreamReader either way, so code that reads on after the callbacks hand the exchange over
    finds it there, after the bytes the sink kept."""

    def __init__(self, reader: asyncio.StreamReader):
        super().__init__(reader)
        self.sink: PodSink | None = None

    def data_received(self, data: bytes) -> None:
        if self.sink is not None:
            self.sink.pod_data(data)
        else:
            super().data_received(data)

    def eof_received(self) -> bool | None:
        keep_open = super().eof_received()
        if self.sink is not None:
            self.sink.pod_ended()
        return keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.sink is not None:
            self.sink.pod_ended()


class Upstream(HeadReader):
    """One connection to a pod: its streams, the bytes read past the last response, where it was dialed and
    with which trust generation its certificate was verified."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        addr: str,
        generation: int,
        protocol: PodProtocol | None = None,
    ):
        super().__init__(reader)
        self.writer, self.addr, self.generation = writer, addr, generation
        self.protocol = protocol  # a PodProtocol, for an exchange relayed in callbacks
        self.reusable = False  # the last exchange ended cleanly, nothing read past it

    def idle(self) -> bool:
        """Nothing read or received past the last response, the stream open: an exchange can start in callbacks."""
        return (
            self.protocol is not None
            and not self.pending
            and not self.eof
            and not buffered(self.reader)
            and not self.reader.at_eof()
            and self.reader.exception() is None
        )

    async def response_head(self, idle: float) -> int:
        return await self.head(b"H", idle, idle)  # "HTTP/1.1 ..."

    def h11(self, method: str | None = None) -> H11Stream:
        """An h11 client for this connection, holding what is pending: ready for a request, or (`method`)
        as if it had just sent a complete one, to read the response to it."""
        stream = H11Stream(h11.CLIENT, self.reader, self.writer, self.reads)
        if method is not None:
            stream.conn.send(h11.Request(method=method, target="/", headers=[("host", "pod")]))
            stream.conn.send(h11.EndOfMessage())
        self.hand_over(stream.conn)
        return stream

    def settle(self, stream: H11Stream) -> None:
        """After an exchange h11 framed: reusable if it ended cleanly and the pod sent nothing past it."""
        left, closed = stream.conn.trailing_data
        self.reusable = stream.reusable() and not left and not closed

    def closing(self) -> bool:
        return self.writer.is_closing() or self.reader.at_eof()

    def close(self) -> None:
        self.reads.close()
        self.writer.close()


class UpstreamPool:
    """Idle upstream connections, shared by every downstream connection as Envoy's HTTP/1.1 pool is: one is
    taken for a request and parked again once its exchange is complete, so a worker's kept-alive connection
    holds none between callbacks. A rotated upstream CA retires every connection verified with the old one."""

    def __init__(self, trust: ReloadingContext):
        self.trust = trust
        self._idle: dict[str, list[Upstream]] = {}  # authority -> idle connections

    def park(self, authority: str, up: Upstream) -> None:
        idle = self._idle.setdefault(authority, [])
        if up.reusable and not up.closing() and len(idle) < MAX_IDLE_PER_AUTHORITY:
            up.reusable = False
            idle.append(up)
        else:
            up.close()

    def checkout(self, authority: str) -> Upstream | None:
        """A parked connection still open and verified with the current trust, if any."""
        self.trust.current()  # notice a rotated CA (or any change to the pod's Secret) before choosing
        idle = self._idle.get(authority) or []
        while idle:
            up = idle.pop()
            if up.generation == self.trust.generation and not up.closing():
                return up
            up.close()
        return None


def dial_failure(exc: BaseException, address: str) -> UpstreamFailure:
    """Why the proxy could not open its connection to a pod: Envoy's UF body, and ncpsim's words."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = f"verify cert failed: X509_verify_cert: certificate verification error at depth 0: {exc.verify_message}"
        return UpstreamFailure(
            "UF", upstream_reset("tls", detail), f"CERTIFICATE_VERIFY_FAILED: {exc.verify_message}"
        )
    if isinstance(exc, Unreachable):  # the network map's own words: no route from this cluster
        return UpstreamFailure("UF", upstream_reset("unreachable"), str(exc))
    if isinstance(exc, ConnectionRefusedError):
        return UpstreamFailure("UF", upstream_reset("refused"), f"connection refused by {address}")
    if isinstance(exc, TimeoutError):
        return UpstreamFailure("UF", upstream_reset("timeout"), f"connection to {address} timed out")
    if isinstance(exc, ssl.SSLError):
        return UpstreamFailure("UF", upstream_reset("other"), f"TLS handshake with {address} failed")
    return UpstreamFailure("UF", upstream_reset("other"), f"connection to {address} failed")


async def dial(ctx: Context, trust: ReloadingContext, host: str, ip: str, port: int, tls: bool) -> Upstream:
    """A new connection to the pod `host` at ip:port, TLS verified against the pod name when `tls`."""
    try:
        reader, writer = await ctx.open_tcp(
            ip, port, tls=trust.current() if tls else None, server_hostname=host, protocol=PodProtocol
        )
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        log.debug("dial %s:%s (%s) failed: %s: %s", ip, port, host, type(exc).__name__, exc)
        raise dial_failure(exc, f"{ip}:{port}") from exc
    sans = peercert_dns_sans(writer.get_extra_info("peercert")) if tls else ()
    if tls and not INVOCATION_UPSTREAM.accepts(sans, host):
        # Envoy refuses it inside the handshake; Python's ssl has no verify callback, so the connection
        # that completed is closed before any byte of the request is sent.
        writer.transport.abort()
        body = upstream_reset("tls", INVOCATION_UPSTREAM.refusal)
        raise UpstreamFailure("UF", body, f"CERTIFICATE_VERIFY_FAILED: {host} is not in [{', '.join(sans)}]")
    protocol = writer.transport.get_protocol()
    pod = protocol if isinstance(protocol, PodProtocol) else None  # (a Context that dials its own way)
    return Upstream(reader, writer, f"{ip}:{port}", trust.generation, pod)


def upstream_fields(head: RequestHead, fwd: Forward, request_id: str) -> list[tuple[str, str]]:
    """The request's fields as Envoy sends them to the pod: hop-by-hop ones (and Expect, which it answered
    itself) dropped, Host the pod's authority, X-Forwarded-Proto and the request id added, the framing kept."""
    strip = HOP_BY_HOP_AND_EXPECT if expects_continue(head) else HOP_BY_HOP
    fields = [("host", fwd.authority), *((k, v) for k, v in head.headers if k not in strip)]
    fields.append(("x-forwarded-proto", "https"))
    if head.header("x-request-id") is None:
        fields.append(("x-request-id", request_id))  # Envoy's own id goes upstream too
    if (length := head.header("content-length")) is not None:
        fields.append(("content-length", length or "0"))
    elif head.header("transfer-encoding") is not None:
        fields.append(("transfer-encoding", "chunked"))
    return fields
