"""The proxy's HTTP/3 front: the load balancer's UDP 443, QUIC with the `*.<workerDomain>` certificate.

The SNI only chooses the certificate: a name the certificate cannot cover (not under `*.<workerDomain>`,
or none at all) finds no filter chain, so the handshake is refused (TLS alert unrecognized_name, logged
with `NR`). Each request stream is then decided on its own by sim.proxy.h3_policy, from `:authority`,
method, pseudo-headers and the header limits, as the rendered Envoy route table decides it: a stream
error resets that stream only, a route miss is 404 `NR`, and a forward goes to the pod the `:authority`
names, whatever the SNI said. (Malformed framing is the codec's, sim.proxy.h3_codec: Envoy's QUICHE answers.) The front opens its own QUIC session to that pod's UDP 10084, verifying the
chain against the stack CA in Secret `grpc-proxy-worker-tls` and the SAN `*.grpc-headless.nvcf.svc.cluster.local`
as Envoy's exact matcher does (sim.proxy.san: a certificate for the pod's own name is refused), and
relays the stream both ways with backpressure (sim.protocols.h3). Sessions to a pod are shared by every
worker connection's streams and pooled as Envoy pools them (sim.proxy.h3_pool): 100 streams a session,
another session when those are taken; DF, UF and UO are the pool's answers.
`x-request-id` is passed through untouched (never generated or replaced): the pod matches it against the
token it minted.
"""

from __future__ import annotations

import time

from aioquic.h3.connection import H3Connection
from aioquic.quic.connection import QuicConnection

from sim.model.values import proxy_settings
from sim.protocols.h3 import (
    AlertUnrecognizedName,
    H3Endpoint,
    H3Server,
    H3Stream,
    ReloadingServerConfig,
    StreamError,
    peek_server_name,
)
from sim.protocols.tasks import Tasks
from sim.proxy.access_log import AccessLog, AccessRecord
from sim.proxy.h3_codec import StreamScopedH3
from sim.proxy.h3_policy import H3Request, Refusal, Reset, decide, decide_sni
from sim.proxy.h3_pool import DialFailed, UpstreamPool
from sim.proxy.policy import Forward, Reject, http_date
from sim.runtime.component import Context
from sim.wire import UC_BODY, UpstreamFailure


class _Connection:
    """One worker's QUIC connection: its SNI (for the logs) and the streams the codec reset."""

    def __init__(self, front: H3Front):
        self.front = front
        self.sni: str | None = None
        self.endpoint: H3Endpoint | None = None
        self.resets: dict[int, Reset] = {}  # streams the codec reset after their headers were handed on
        self.gone = False

    def on_hello(self, sni: str | None) -> None:
        """The SNI only chooses the certificate: a name it cannot cover finds no filter chain."""
        self.sni = sni
        refusal = decide_sni(sni, self.front.worker_domain)
        if isinstance(refusal, Refusal) and refusal.status == 0:
            self.front.refused(sni, refusal)
            raise AlertUnrecognizedName(refusal.reason)

    def on_request(self, stream: H3Stream) -> None:
        self.front.tasks.spawn(self.front.relay(self, stream), f"h3-front:{self.sni}:{stream.stream_id}")

    def on_reset(self, stream_id: int, reset: Reset) -> None:
        stream = self.endpoint.streams.get(stream_id) if self.endpoint is not None else None
        if stream is None:  # reset before its headers reached us: nothing relays it, so log it here
            self.front.log_reset(self, reset)
            return
        self.resets[stream_id] = reset
        stream._on_error(StreamError(f"malformed request: {reset.reason}"))

    def on_closed(self) -> None:
        self.gone = True


class _FrontEndpoint(H3Endpoint):
    """A worker's connection to the front: its HTTP/3 layer resets malformed streams, not the connection."""

    def __init__(self, quic: QuicConnection, conn: _Connection):
        super().__init__(quic, on_request=conn.on_request)
        self.conn = conn
        conn.endpoint = self
        self.on_closed = conn.on_closed

    def new_h3(self) -> H3Connection:
        return StreamScopedH3(self.quic, self.conn.on_reset)


class H3Front:
    def __init__(self, ctx: Context, access_log: AccessLog):
        self.ctx, self.access_log = ctx, access_log
        self.worker_domain = ctx.topology.worker_domain
        self.tasks = Tasks()
        self.server: H3Server | None = None
        self.pool = UpstreamPool(ctx, self.tasks)  # every pod's sessions, shared by all worker connections

    async def start(self) -> int:
        config = ReloadingServerConfig(
            self.ctx.secret(proxy_settings(self.ctx.values).frontend_secret), self._tls_error
        )
        self.server = H3Server(config, self._endpoint)
        return await self.server.start()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()  # closes every worker connection
        await self.tasks.cancel_all()  # dials in progress first: none may add a session after this
        self.pool.close()

    def _tls_error(self, message: str) -> None:
        self.ctx.events.emit("proxy.tls.reload_failed", listener="h3", error=message)

    def _endpoint(self, quic: QuicConnection) -> H3Endpoint:
        conn = _Connection(self)
        endpoint = _FrontEndpoint(quic, conn)
        peek_server_name(quic, conn.on_hello)
        return endpoint

    def refused(self, sni: str | None, refusal: Refusal) -> None:
        record = AccessRecord(start=time.time(), protocol="-", flags=refusal.flag, authority=sni or "-")
        self.access_log.write(record)
        self.ctx.events.emit("proxy.h3.refused", authority=sni, reason=refusal.reason, flags=refusal.flag)

    def log_reset(self, conn: _Connection, reset: Reset) -> None:
        record = AccessRecord(start=time.time(), protocol="HTTP/3", flags=reset.flag)
        self._log(conn, record, reset.reason)

    def _log(self, conn: _Connection, record: AccessRecord, detail: str | None) -> None:
        self.access_log.write(record)
        self.ctx.events.emit(
            "proxy.h3.stream",
            requestId=None if record.request_id == "-" else record.request_id,
            authority=record.authority,
            sni=conn.sni,
            upstream=record.upstream_host,
            status=record.status,
            flags=record.flags,
            method=record.method,
            path=record.path,
            details=detail,
        )

    # One request stream ----------------------------------------------------------------------
    async def relay(self, conn: _Connection, down: H3Stream) -> None:
        record = AccessRecord(start=time.time(), protocol="HTTP/3", forwarded_for="-")
        detail = None
        try:
            headers = await down.headers
            request = H3Request.of(headers)
            record.method, record.path = request.get(":method") or "-", request.get(":path") or "-"
            record.authority = request.get(":authority") or "-"
            record.user_agent = request.get("user-agent") or "-"
            record.request_id = request.get("x-request-id") or "-"
            decision = decide(request, self.worker_domain)
            if isinstance(decision, Reset):
                detail, record.flags = decision.reason, decision.flag
                down.reset(decision.error_code)
            elif isinstance(decision, Reject):
                detail = decision.reason
                self._local_reply(down, record, decision.status, decision.flag, "")
            else:
                await self._forward(conn, down, headers, decision, record)
        except UpstreamFailure as failure:
            detail = failure.detail
            self._local_reply(down, record, 503, failure.flag, failure.body)
        except StreamError as exc:  # one side went away mid-stream (flag set by _forward, else DC)
            detail = str(exc)
            reset = conn.resets.pop(down.stream_id, None)
            record.flags = "DPE" if reset is not None else record.flags if record.flags != "-" else "DC"
        finally:
            record.bytes_received, record.bytes_sent = down.bytes_received, down.bytes_sent
            record.finish()
            self._log(conn, record, detail)

    async def _forward(
        self,
        conn: _Connection,
        down: H3Stream,
        headers: list[tuple[bytes, bytes]],
        route: Forward,
        record: AccessRecord,
    ) -> None:
        try:
            session, upstream = await self.pool.acquire(route.host)
        except DialFailed as failed:
            record.upstream_host = failed.host
            raise
        record.upstream_host = upstream.host
        try:
            if conn.gone:  # the worker left while we dialed; the session stays for the next stream
                raise StreamError("downstream connection closed")
            await self._relay_upstream(down, upstream.endpoint, headers, route, record)
        finally:
            self.pool.release(session)

    async def _relay_upstream(
        self,
        down: H3Stream,
        upstream: H3Endpoint,
        headers: list[tuple[bytes, bytes]],
        route: Forward,
        record: AccessRecord,
    ) -> None:
        sent = time.monotonic()
        # Envoy sets x-forwarded-proto (never trusts it) and rewrites :authority to the pod it dials.
        forwarded = [
            (k, route.authority.encode() if k == b":authority" else v)
            for k, v in headers
            if k != b"x-forwarded-proto"
        ]
        up = upstream.open_request([*forwarded, (b"x-forwarded-proto", b"https")])
        request_body = self.tasks.spawn(_pump(down, up), f"h3-front:request-body:{up.stream_id}")
        try:
            try:
                response = await up.headers
            except StreamError as exc:
                raise UpstreamFailure("UC", UC_BODY, str(exc)) from exc
            record.upstream_service_time = str(int((time.monotonic() - sent) * 1000))
            record.status = up.status
            dropped = (b"server", b"date", b"x-envoy-upstream-service-time")  # Envoy sets its own
            kept = [(k, v) for k, v in response if k not in dropped]
            down.send_headers(
                [
                    *kept,
                    (b"x-envoy-upstream-service-time", record.upstream_service_time.encode()),
                    (b"date", http_date(time.time()).encode()),
                    (b"server", b"envoy"),
                ]
            )
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

    @staticmethod
    def _local_reply(down: H3Stream, record: AccessRecord, status: int, flag: str, body: str) -> None:
        record.status, record.flags = status, flag
        data = body.encode()
        try:
            down.send_headers(
                [
                    (b":status", str(status).encode()),
                    (b"content-type", b"text/plain"),
                    (b"content-length", str(len(data)).encode()),
                    (b"date", http_date(time.time()).encode()),
                    (b"server", b"envoy"),
                ],
                end=not data,
            )
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
