"""The proxy's HTTP/3 front: the load balancer's UDP 443, QUIC with the `*.<workerDomain>` certificate.

A worker names its grpc-proxy pod in the SNI, `<dashed-pod-ip>.<workerDomain>`. The front opens its own
QUIC session to that pod's UDP 10084, verifying `*.grpc-headless.nvcf.svc.cluster.local` against the
stack CA in Secret `grpc-proxy-worker-tls` (SNI `<dashed-pod-ip>.grpc-headless...`, a name that
certificate covers), and relays each request stream both ways with backpressure (sim.protocols.h3).

What Envoy would do, as `decide_sni` decides it:
- SNI missing or not under `*.<workerDomain>`: no filter chain matches, so the handshake is refused
  (TLS alert unrecognized_name); Envoy's listener access log records such a connection with `NR`.
- SNI under the domain but not `<dashed-ip>.<workerDomain>` (`invocation.<domain>`, `foo.<domain>`):
  the handshake succeeds (the wildcard certificate covers it) and every request gets 404 `NR`.
- A dashed IP whose pod name does not resolve in the control cluster (no such grpc-proxy pod): 503 `DF`.
- Pod unreachable, silent, or with a certificate the stack CA or the name does not verify: 503 `UF`.
One upstream session per worker connection, opened at its first request. `x-request-id` is passed
through untouched (never generated or replaced): the pod matches it against the token it minted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from aioquic.quic.connection import QuicConnection

from certs.profiles import FRONTEND_SECRET, GRPC_SECRET, PUBLIC, PUBLIC_FRONTEND_SECRET
from dns.client import NameNotResolved
from dns.rule import dashed_ip, normalize_name, undash
from sim.protocols.h3 import (
    AlertUnrecognizedName,
    H3Endpoint,
    H3Server,
    H3Stream,
    HandshakeFailed,
    ReloadingServerConfig,
    StreamError,
    Tasks,
    client_configuration,
    close_client,
    connect,
    peek_server_name,
    trust_pem,
)
from sim.protocols.wire import (
    DF_BODY,
    GRPC_CALLBACK_PORT,
    GRPC_SUFFIX,
    UC_BODY,
    UF_BODY,
    UF_TLS_BODY,
    UpstreamFailure,
)
from sim.proxy.access_log import AccessLog, AccessRecord
from sim.runtime.component import CONNECT_TIMEOUT, Context


# -- the decision (pure) -------------------------------------------------------------------------
@dataclass(frozen=True)
class PodRoute:
    pod_ip: str

    @property
    def upstream_name(self) -> str:
        return f"{dashed_ip(self.pod_ip)}.{GRPC_SUFFIX}"


@dataclass(frozen=True)
class Refusal:
    status: int  # 0: refuse the handshake itself
    flag: str
    reason: str


def decide_sni(sni: str | None, worker_domain: str) -> PodRoute | Refusal:
    name, domain = normalize_name(sni or ""), normalize_name(worker_domain) or ""
    if name is None or not name.endswith("." + domain):
        return Refusal(0, "NR", f"no filter chain matches server name {sni!r}")
    ip = undash(name[: -len(domain) - 1])
    if ip is None:
        return Refusal(404, "NR", "route_not_found")
    return PodRoute(ip)


def frontend_secret(values: dict) -> str:
    """The Secret the front serves: the public-style one when the values bring their own certificate."""
    from sim.model.values import proxy_settings

    return PUBLIC_FRONTEND_SECRET if proxy_settings(values).frontend_issuer == PUBLIC else FRONTEND_SECRET


def _text(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}


# -- I/O -----------------------------------------------------------------------------------------
class _Connection:
    """One worker's QUIC connection: its SNI decision and the upstream session it gets."""

    def __init__(self, front: H3Front):
        self.front = front
        self.sni: str | None = None
        self.route: PodRoute | Refusal = Refusal(0, "NR", "no ClientHello yet")
        self.upstream: H3Endpoint | None = None
        self.upstream_host = "-"
        self.gone = False

    def on_hello(self, sni: str | None) -> None:
        self.sni, self.route = sni, decide_sni(sni, self.front.worker_domain)
        if isinstance(self.route, Refusal) and self.route.status == 0:
            self.front.refused(sni, self.route)
            raise AlertUnrecognizedName(self.route.reason)

    def on_request(self, stream: H3Stream) -> None:
        self.front.tasks.spawn(self.front.relay(self, stream), f"h3-front:{self.sni}:{stream.stream_id}")

    def on_closed(self) -> None:
        self.gone = True
        if self.upstream is not None:
            close_client(self.upstream)


class H3Front:
    def __init__(self, ctx: Context, access_log: AccessLog):
        self.ctx, self.access_log = ctx, access_log
        self.worker_domain = ctx.topology.worker_domain
        self.tasks = Tasks()
        self.server: H3Server | None = None

    async def start(self) -> int:
        config = ReloadingServerConfig(self.ctx.secret(frontend_secret(self.ctx.values)), self._tls_error)
        self.server = H3Server(config, self._endpoint)
        return await self.server.start()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()  # closes every worker connection, and with it each upstream session
        await self.tasks.cancel_all()

    def _tls_error(self, message: str) -> None:
        self.ctx.events.emit("proxy.tls.reload_failed", listener="h3", error=message)

    def _endpoint(self, quic: QuicConnection) -> H3Endpoint:
        conn = _Connection(self)
        endpoint = H3Endpoint(quic, on_request=conn.on_request)
        endpoint.on_closed = conn.on_closed
        peek_server_name(quic, conn.on_hello)
        return endpoint

    def refused(self, sni: str | None, refusal: Refusal) -> None:
        record = AccessRecord(start=time.time(), protocol="-", flags=refusal.flag, authority=sni or "-")
        self.access_log.write(record)
        self.ctx.events.emit("proxy.h3.refused", authority=sni, reason=refusal.reason, flags=refusal.flag)

    # One request stream ----------------------------------------------------------------------
    async def relay(self, conn: _Connection, down: H3Stream) -> None:
        record = AccessRecord(start=time.time(), protocol="HTTP/3", forwarded_for="-", authority=conn.sni or "-")
        detail = None
        try:
            headers = await down.headers
            head = _text(headers)
            record.method, record.path = head.get(":method", "-"), head.get(":path", "-")
            record.user_agent, record.request_id = head.get("user-agent", "-"), head.get("x-request-id", "-")
            await self._forward(conn, down, headers, record)
        except UpstreamFailure as failure:
            detail = failure.detail
            self._local_reply(down, record, 503, failure.flag, failure.body)
        except StreamError as exc:  # one side went away mid-stream (flag set by _forward, else DC)
            detail = str(exc)
            record.flags = record.flags if record.flags != "-" else "DC"
        finally:
            record.bytes_received, record.bytes_sent = down.bytes_received, down.bytes_sent
            record.upstream_host = conn.upstream_host
            record.finish()
            self.access_log.write(record)
            self.ctx.events.emit("proxy.h3.stream", requestId=None if record.request_id == "-" else record.request_id,
                                 authority=record.authority, upstream=conn.upstream_host, status=record.status,
                                 flags=record.flags, method=record.method, path=record.path, details=detail)

    async def _forward(self, conn: _Connection, down: H3Stream, headers: list[tuple[bytes, bytes]],
                       record: AccessRecord) -> None:
        if isinstance(conn.route, Refusal):
            self._local_reply(down, record, conn.route.status, conn.route.flag, "")
            return
        upstream = await self._upstream(conn, conn.route)
        sent = time.monotonic()
        forwarded = [(k, v) for k, v in headers if k != b"x-forwarded-proto"]  # Envoy sets it, never trusts it
        up = upstream.open_request([*forwarded, (b"x-forwarded-proto", b"https")])
        request_body = self.tasks.spawn(_pump(down, up), f"h3-front:request-body:{up.stream_id}")
        try:
            try:
                response = await up.headers
            except StreamError as exc:
                raise UpstreamFailure("UC", UC_BODY, str(exc)) from exc
            record.upstream_service_time = str(int((time.monotonic() - sent) * 1000))
            record.status = up.status
            kept = [(k, v) for k, v in response if k not in (b"server", b"x-envoy-upstream-service-time")]
            down.send_headers([*kept, (b"server", b"envoy"),
                               (b"x-envoy-upstream-service-time", record.upstream_service_time.encode())])
            await _pump(up, down)
            await request_body
        except StreamError:
            # After the response started, a failure is a reset of the other side, flagged as Envoy does.
            record.flags = "UR" if up.error is not None and down.error is None else "DC"
            up.reset()
            down.reset()
            raise
        finally:
            request_body.cancel()
            if not up.local_ended:  # e.g. a failed upstream: the worker gets a local reply instead
                up.reset()

    async def _upstream(self, conn: _Connection, route: PodRoute) -> H3Endpoint:
        if conn.upstream is not None and not conn.upstream.closed:
            return conn.upstream
        name = route.upstream_name
        try:
            ip = (await self.ctx.resolve(name))[0]  # the proxy lives in the control cluster
        except NameNotResolved as exc:
            raise UpstreamFailure("DF", DF_BODY, f"{name}: {exc.rcode}") from exc
        except OSError as exc:  # cluster DNS itself unreachable
            raise UpstreamFailure("DF", DF_BODY, f"{name}: {exc}") from exc
        conn.upstream_host = f"{ip}:{GRPC_CALLBACK_PORT}"
        try:
            addr = self.ctx.udp_address(ip, GRPC_CALLBACK_PORT)
        except OSError as exc:
            raise UpstreamFailure("UF", UF_BODY, str(exc)) from exc
        # The CA is read for each new session, so a rotated grpc-proxy-worker-tls applies without restart.
        trust = trust_pem([self.ctx.secret(GRPC_SECRET) / "ca.crt"])
        try:
            upstream = await connect(addr, client_configuration(name, trust), timeout=CONNECT_TIMEOUT)
        except HandshakeFailed as exc:
            if exc.certificate_rejected:
                raise UpstreamFailure("UF", UF_TLS_BODY, f"CERTIFICATE_VERIFY_FAILED: {exc.reason}") from exc
            raise UpstreamFailure("UF", UF_BODY, f"QUIC handshake failed: {exc.reason}") from exc
        if conn.gone:  # the worker left while we dialed
            close_client(upstream)
            raise StreamError("downstream connection closed")
        if conn.upstream is not None and not conn.upstream.closed:  # a concurrent stream won the race
            close_client(upstream)
            return conn.upstream
        conn.upstream = upstream
        return upstream

    @staticmethod
    def _local_reply(down: H3Stream, record: AccessRecord, status: int, flag: str, body: str) -> None:
        record.status, record.flags = status, flag
        data = body.encode()
        try:
            down.send_headers([(b":status", str(status).encode()), (b"content-type", b"text/plain"),
                               (b"content-length", str(len(data)).encode()), (b"server", b"envoy")],
                              end=not data)
            if data:
                down.write(data, end=True)
        except StreamError:
            pass


async def _pump(src: H3Stream, dst: H3Stream) -> None:
    """Copy one direction of a stream; reading waits on the writer's drain, which is the backpressure."""
    while chunk := await src.read():
        dst.write(chunk)
        await dst.drain()
    if src.trailers:
        dst.send_headers(src.trailers, end=True)
    else:
        dst.end()
