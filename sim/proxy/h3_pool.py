"""The HTTP/3 front's upstream sessions to grpc-proxy pods, pooled as Envoy pools them (sim.proxy.h3_policy).

Envoy pools upstream connections per host of its cluster, not per downstream connection: every worker's
streams to a pod share its sessions. A session carries at most 100 streams (fewer if the pod's MAX_STREAMS
says so); a stream for which no session has room opens another one, so request streams one client holds
open can fill a session, never the pod's path (issue 31: about 130 held streams used up the one shared
session's credit, and every real callback to that pod then failed after 10 s). Which session a stream takes
is sim.proxy.h3_policy.pick_session's decision; this module only dials, counts and closes.

A dial is shared: streams that arrive while a session is being dialed wait for that dial (it counts their
streams), and a failed dial fails them all, as Envoy fails the requests pending on a connection that did not
come up. A session that closed, or whose pod IP now leads elsewhere (the pod restarted), is dropped.
- A pod name that does not resolve in the control cluster: 503 `DF`.
- Pod unreachable, silent, or with a certificate the stack CA or the name does not verify: 503 `UF`.
- No session with room and the circuit breaker's 1024 connections open: 503 `UO` at once (Envoy would first
  queue the stream while max_pending_requests allows; ncpsim does not model that queue).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from certs.profiles import GRPC_SECRET
from dns.client import NameNotResolved
from sim.protocols.h3 import (
    AlertCertificateUnknown,
    H3Endpoint,
    HandshakeFailed,
    client_configuration,
    close_client,
    trust_pem,
)
from sim.protocols.tasks import Tasks
from sim.proxy.h3_policy import (
    MAX_CONCURRENT_STREAMS,
    MAX_CONNECTIONS,
    Overflow,
    SessionLoad,
    UseSession,
    pick_session,
)
from sim.proxy.policy import upstream_reset
from sim.proxy.san import GRPC_UPSTREAM, x509_dns_sans
from sim.runtime.component import CONNECT_TIMEOUT, Context
from sim.runtime.quic_dial import open_quic
from sim.wire import DF_BODY, GRPC_CALLBACK_PORT, UpstreamFailure


@dataclass(frozen=True)
class Upstream:
    """A QUIC session up to one grpc-proxy pod: the pod IP its name resolved to, the loopback address that IP
    had when the session opened."""

    endpoint: H3Endpoint
    ip: str
    addr: tuple[str, int]

    @property
    def host(self) -> str:  # %UPSTREAM_HOST%
        return f"{self.ip}:{GRPC_CALLBACK_PORT}"


Dialed = Upstream | UpstreamFailure


class DialFailed(UpstreamFailure):
    """The stream gets no session: why, and the pod address the dial had got to (%UPSTREAM_HOST%, or -)."""

    def __init__(self, failure: UpstreamFailure, host: str = "-"):
        super().__init__(failure.flag, failure.body, failure.detail)
        self.host = host


@dataclass(eq=False)
class Session:
    """One pooled session from its dial on. `active` counts the streams that chose it, from the moment they
    did (a dial in progress is full once MAX_CONCURRENT_STREAMS streams wait for it)."""

    active: int = 0
    host: str = "-"  # ip:port once the name resolved, for the access log of a stream whose dial failed
    dial: asyncio.Task[Dialed] = field(init=False)  # set as the session is made (UpstreamPool._dial)

    @property
    def upstream(self) -> Upstream | None:
        if not self.dial.done() or self.dial.cancelled():
            return None
        result = self.dial.result()
        return result if isinstance(result, Upstream) else None

    def load(self) -> SessionLoad:
        upstream = self.upstream
        return SessionLoad(self.active, None if upstream is None else stream_credit(upstream.endpoint))


def stream_credit(endpoint: H3Endpoint) -> int:
    """More bidirectional streams the peer lets this client open now (its MAX_STREAMS, less those opened)."""
    quic = endpoint.quic
    return max(0, quic._remote_max_streams_bidi - quic._local_next_stream_id_bidi // 4)


class UpstreamPool:
    """Every pod's sessions, by pod name; streams take one with `acquire` and give it back with `release`."""

    def __init__(self, ctx: Context, tasks: Tasks):
        self.ctx, self.tasks = ctx, tasks
        # Read as the pool is made, so a test can set them (tests/test_h3_pool.py caps the connections).
        self.max_streams, self.max_connections = MAX_CONCURRENT_STREAMS, MAX_CONNECTIONS
        self.pods: dict[str, list[Session]] = {}

    async def acquire(self, name: str) -> tuple[Session, Upstream]:
        """A session to pod `name` with room for one more stream (dialed if need be), counted as taken:
        `release` it when the stream is done. Raises DialFailed (DF, UF, UO)."""
        sessions = self._current(name)
        choice = pick_session(
            [s.load() for s in sessions], self.open_sessions(), self.max_streams, self.max_connections
        )
        if isinstance(choice, Overflow):
            raise DialFailed(UpstreamFailure("UO", upstream_reset("overflow"), choice.reason))
        session = sessions[choice.index] if isinstance(choice, UseSession) else self._dial(name)
        session.active += 1
        try:
            dialed = await asyncio.shield(session.dial)  # a stream that gives up must not end a shared dial
        except BaseException:
            session.active -= 1
            raise
        if isinstance(dialed, UpstreamFailure):
            session.active -= 1
            raise DialFailed(dialed, session.host)
        return session, dialed

    @staticmethod
    def release(session: Session) -> None:
        session.active -= 1

    def open_sessions(self) -> int:
        """Sessions open or being dialed, to every pod: what the circuit breaker counts."""
        return sum(len(sessions) for sessions in self.pods.values())

    def close(self) -> None:
        for sessions in self.pods.values():
            for session in sessions:
                if session.upstream is not None:
                    close_client(session.upstream.endpoint)
        self.pods.clear()

    # -- sessions --------------------------------------------------------------------------------------
    def _current(self, name: str) -> list[Session]:
        """The pod's sessions still worth a stream: dialing, or open to where its IP leads now."""
        sessions = self.pods.setdefault(name, [])
        for session in list(sessions):
            upstream = session.upstream
            if session.dial.done() and (upstream is None or not self._usable(upstream)):
                sessions.remove(session)
                if upstream is not None:
                    close_client(upstream.endpoint)  # closed already, or to a pod that is no longer there
        return sessions

    def _usable(self, upstream: Upstream) -> bool:
        """Open, and the pod IP still leads where it did (a restarted pod listens elsewhere)."""
        if upstream.endpoint.closed:
            return False
        try:
            return self.ctx.udp_address(upstream.ip, GRPC_CALLBACK_PORT) == upstream.addr
        except OSError:
            return False

    def _dial(self, name: str) -> Session:
        session = Session()
        session.dial = self.tasks.spawn(self._connect(name, session), f"h3-front:dial:{name}")
        self.pods.setdefault(name, []).append(session)
        return session

    async def _connect(self, name: str, session: Session) -> Dialed:
        """Resolve the pod's name, then open a QUIC session to it; a failure is the value answered, not raised
        (every stream waiting on this dial gets it)."""
        try:
            dialed = await self._open(name, session)
        except BaseException:
            self._forget(name, session)
            raise
        if isinstance(dialed, UpstreamFailure):
            self._forget(name, session)
        return dialed

    async def _open(self, name: str, session: Session) -> Dialed:
        try:
            ip = (await self.ctx.resolve(name))[0]  # the proxy lives in the control cluster
        except NameNotResolved as exc:
            return UpstreamFailure("DF", DF_BODY, f"{name}: {exc.rcode}")
        except OSError as exc:  # cluster DNS itself unreachable
            return UpstreamFailure("DF", DF_BODY, f"{name}: {exc}")
        session.host = f"{ip}:{GRPC_CALLBACK_PORT}"
        try:
            addr = self.ctx.udp_address(ip, GRPC_CALLBACK_PORT)
        except OSError as exc:  # nothing there to answer: quiche hears nothing back
            return UpstreamFailure("UF", upstream_reset("quic"), str(exc))
        # The CA is read for each new session, so a rotated grpc-proxy-worker-tls applies without restart.
        trust = trust_pem([self.ctx.secret(GRPC_SECRET) / "ca.crt"])
        config = client_configuration(name, trust)
        try:
            endpoint = await open_quic(
                self.ctx, ip, GRPC_CALLBACK_PORT, config, timeout=CONNECT_TIMEOUT, check=grpc_pod_names(name)
            )
        except HandshakeFailed as exc:
            if exc.certificate_rejected:
                body = upstream_reset("quic-tls")
                return UpstreamFailure("UF", body, f"CERTIFICATE_VERIFY_FAILED: {exc.reason}")
            return UpstreamFailure("UF", upstream_reset("quic"), f"QUIC handshake failed: {exc.reason}")
        return Upstream(endpoint, ip, addr)

    def _forget(self, name: str, session: Session) -> None:
        sessions = self.pods.get(name, [])
        if session in sessions:
            sessions.remove(session)


def grpc_pod_names(name: str) -> Callable[[Any], None]:
    """The proxy's name check of a grpc-proxy pod certificate, after its chain: Envoy's exact SAN matcher
    (sim.proxy.san.GRPC_UPSTREAM), not a hostname check of `name`, so a certificate issued for the pod's
    own name is refused."""

    def check(certificate: Any) -> None:
        sans = x509_dns_sans(certificate)
        if not GRPC_UPSTREAM.accepts(sans, name):
            raise AlertCertificateUnknown(
                f"{GRPC_UPSTREAM.refusal}: certificate SANs are [{', '.join(sans)}]"
            )

    return check
