"""The proxy's HTTP/1.1 front: TLS on the 10084 listener, forward-proxy requests relayed to pods.

Bytes and timeouts only; every routing decision comes from sim.proxy.policy.decide.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

import h11

from dns.client import NameNotResolved
from sim.model.events import PROXY_DECISION
from sim.protocols.h1plain import PlainRequest, plain_request, request_bytes
from sim.protocols.http1 import H11Stream, decode_headers, encode_headers
from sim.protocols.listener import TcpListener
from sim.protocols.tls import ReloadingContext
from sim.proxy import plain_relay, relay
from sim.proxy.access_log import AccessLog, AccessRecord
from sim.proxy.downstream import (
    Downstream,
    DownstreamClosed,
    connection_idle_timeout,
    local_reply,
    log,
    read_head,
    reason,
    reply_body,
    send_continue,
)
from sim.proxy.policy import (
    Decision,
    Forward,
    ProxyPolicy,
    Reject,
    RequestHead,
    Tunnel,
    decide,
    expects_continue,
    has_body,
    http_date,
    raw_field_values,
)
from sim.proxy.tunnel import splice
from sim.proxy.upstream import Upstream, UpstreamPool, dial, dial_failure, upstream_fields
from sim.proxy.worker_connection import WorkerConnection
from sim.runtime.component import Context
from sim.wire import DF_BODY, UC_BODY, UpstreamFailure

UPSTREAM_CLOSED = "upstream connection closed mid-response"
DNS_CACHE_TTL = 5.0


def request_head(event: h11.Request, raw_head: bytes | None = None) -> RequestHead:
    """What decide() sees of a parsed request (shared with the property tests, so they judge this path).
    `raw_head`, the bytes as sent, shows what h11 folds away (repeated Content-Length)."""
    return RequestHead(
        method=event.method.decode("latin-1"),
        target=event.target.decode("latin-1"),
        http_version=event.http_version.decode("latin-1"),
        headers=tuple(decode_headers(event.headers)),
        content_lengths=None if raw_head is None else raw_field_values(raw_head, "content-length"),
    )


def _closing(reject: Reject, head: RequestHead) -> Reject:
    """A local reply to a request whose body is still to come ends the connection, as in Envoy."""
    return replace(reject, close=True) if has_body(head) and not reject.close else reject


class HttpFront:
    def __init__(
        self,
        ctx: Context,
        policy: ProxyPolicy,
        access_log: AccessLog,
        frontend: ReloadingContext,
        upstream_trust: ReloadingContext,
        stream_idle_timeout: float = 300.0,
        connection_idle: float | None = None,
    ):
        self.ctx, self.policy, self.access_log = ctx, policy, access_log
        self.frontend, self.upstream_trust = frontend, upstream_trust
        self.stream_idle_timeout = stream_idle_timeout
        self.connection_idle_timeout = connection_idle or connection_idle_timeout()
        self.listener: TcpListener | None = None
        self._dns_cache: dict[str, tuple[float, str]] = {}
        self.pool = UpstreamPool(upstream_trust)
        self.connections: set[WorkerConnection] = set()  # open, each in its callbacks or its task

    async def start(self) -> int:
        self.listener = TcpListener(
            None, self.frontend.sni_switcher(), protocol=lambda: WorkerConnection(self)
        )
        return await self.listener.start()

    async def close(self) -> None:
        if self.listener:
            self.listener.close()
        for conn in list(self.connections):
            conn.shut()

    async def serve(self, conn: WorkerConnection, first: Coroutine[Any, Any, bool]) -> None:
        """A worker's connection on the coroutine path: `first` (the callbacks' request, from the point they
        reached), then request by request until the connection ends or goes back to its callbacks."""
        ended: BaseException | None = None
        try:
            more = await first
            while more:
                if conn.take_back():
                    return
                more = await self._one_request(conn.down)
        except asyncio.CancelledError:  # the front shutting down: the connection ends quietly
            first.close()  # (never started, if cancelled before its first step)
            conn.down.close()
            return
        except Exception as exc:  # noqa: BLE001 - one line in the log per connection, never a traceback
            ended = exc
        conn.ended(ended)

    async def _one_request(self, down: Downstream, record: AccessRecord | None = None) -> bool:
        """Serve one request; True when the connection can take another. A plain request the policy forwards
        is relayed as its bytes came (plain_relay); h11 reads and answers every other. `record`: the one the
        connection's callbacks began, when they hand the request over."""
        record = record or AccessRecord(start=time.time(), forwarded_for="-")
        try:
            end = await down.request_head(self.stream_idle_timeout, self.connection_idle_timeout)
        except TimeoutError:  # a head begun, then silence: h11 holds the part that came, as it would have
            await self._local_reply(down.judge(), record, Reject(408, "SI", "stream timeout", close=True))
            return False
        if end < 0 and down.eof and not down.pending:
            return False  # closed between requests: h11 would read ConnectionClosed, and nothing is answered
        plain = plain_request(bytes(down.pending[:end])) if end >= 0 else None
        if plain is not None:
            head = RequestHead(plain.method, plain.target, "1.1", plain.headers, plain.content_lengths)
            decision = decide(head, self.policy)
            if isinstance(decision, Forward):
                record.request_id = head.header("x-request-id") or str(uuid.uuid4())
                return await self._forward_plain(down, plain, head, decision, record)
        stream = down.judge()
        if more := await self._judged(stream, record):
            down.resume(stream)
        return more

    async def _judged(self, down: H11Stream, record: AccessRecord) -> bool:
        """One request read and answered by h11: every request that is not plain, and every refusal."""
        try:
            event, raw = await read_head(down, self.stream_idle_timeout, self.connection_idle_timeout)
        except h11.RemoteProtocolError as exc:
            log.debug("codec refused a request head: %s", exc)
            await self._local_reply(
                down, record, Reject(exc.error_status_hint, "DPE", "malformed request", close=True)
            )
            return False
        except TimeoutError:
            await self._local_reply(down, record, Reject(408, "SI", "stream timeout", close=True))
            return False
        if isinstance(event, h11.ConnectionClosed):
            return False
        assert isinstance(event, h11.Request)
        head = request_head(event, raw)
        record.describe(head)
        record.request_id = head.header("x-request-id") or str(uuid.uuid4())
        decision = decide(head, self.policy)
        if expects_continue(head) and not (isinstance(decision, Reject) and decision.close):
            await send_continue(down)  # before routing, as Envoy's connection manager does
        if not isinstance(decision, Forward):  # a forwarded request is on record in the access log line
            self.ctx.events.emit(
                PROXY_DECISION,
                requestId=record.request_id,
                target=head.target,
                method=head.method,
                decision=type(decision).__name__,
                status=getattr(decision, "status", None),
                flag=getattr(decision, "flag", None),
                reason=getattr(decision, "reason", None),
            )
        return await self._dispatch(down, head, decision, record)

    async def _dispatch(
        self, down: H11Stream, head: RequestHead, decision: Decision, record: AccessRecord
    ) -> bool:
        if isinstance(decision, Reject):
            decision = _closing(decision, head)
            await self._local_reply(down, record, decision, head.method == "HEAD")
            return not decision.close and await self._drain(down)
        if isinstance(decision, Tunnel):
            await self._tunnel(down, decision, record)
            return False
        return await self._forward(down, head, decision, record)

    async def _local_reply(
        self, down: H11Stream, record: AccessRecord, reject: Reject, head_request: bool = False
    ) -> None:
        record.status, record.flags = reject.status, reject.flag
        try:
            record.bytes_sent = await local_reply(
                down, reject.status, reply_body(reject), reject.close, head_request
            )
        except (h11.LocalProtocolError, ConnectionError) as exc:
            log.debug("local reply %s not delivered: %s", reject.status, exc)
        self._log(record)

    async def _drain(self, down: H11Stream) -> bool:
        """Read the rest of a rejected request so the connection can be reused."""
        while down.conn.their_state is h11.SEND_BODY:
            try:
                event = await down.next_event(self.stream_idle_timeout)
            except h11.RemoteProtocolError:
                if down.reader.at_eof():  # h11 calls a hang-up mid-body a protocol error; it is a hang-up
                    raise DownstreamClosed("worker connection closed mid-request") from None
                raise
            if isinstance(event, h11.ConnectionClosed):
                return False
        return down.reusable()

    def _log(self, record: AccessRecord) -> None:
        record.finish()
        self.access_log.write(record)  # the replay reads this log itself: no second copy as an event

    # Upstream ------------------------------------------------------------------------------
    async def _resolve(self, host: str) -> str:
        cached = self._dns_cache.get(host)
        now = time.monotonic()
        if cached and cached[0] > now:
            return cached[1]
        try:
            ip = (await self.ctx.resolve(host))[0]
        except NameNotResolved as exc:
            raise UpstreamFailure("DF", DF_BODY, f"{host}: {exc.rcode}") from exc
        self._dns_cache[host] = (now + DNS_CACHE_TTL, ip)
        return ip

    async def _upstream(self, fwd: Forward, record: AccessRecord) -> Upstream:
        """A connection to the pod: a parked one, or a new one. UPSTREAM_HOST names the address tried even
        when the dial fails (UF), as Envoy logs the host it picked."""
        up = self.pool.checkout(fwd.authority)
        if up is None:
            ip = await self._resolve(fwd.host)
            record.upstream_host = f"{ip}:{fwd.port}"
            up = await dial(self.ctx, self.upstream_trust, fwd.host, ip, fwd.port, fwd.tls)
        record.upstream_host = up.addr
        return up

    async def _unreachable(
        self, down: H11Stream, head: RequestHead, fwd: Forward, record: AccessRecord, failure: UpstreamFailure
    ) -> bool:
        self.ctx.events.emit(
            "proxy.upstream.failed",
            requestId=record.request_id,
            host=fwd.host,
            flag=failure.flag,
            detail=failure.detail,
        )
        reject = _closing(Reject(503, failure.flag, failure.body), head)
        await self._local_reply(down, record, reject, head.method == "HEAD")
        return not reject.close and await self._drain(down)

    async def _forward(self, down: H11Stream, head: RequestHead, fwd: Forward, record: AccessRecord) -> bool:
        try:
            up = await self._upstream(fwd, record)
        except UpstreamFailure as failure:
            return await self._unreachable(down, head, fwd, record, failure)
        fields = upstream_fields(head, fwd, record.request_id)
        request = h11.Request(method=head.method, target=fwd.path, headers=encode_headers(fields))
        pod = up.h11()
        try:
            ok = await relay.exchange(down, pod, request, record, self.stream_idle_timeout)
        except (ConnectionError, h11.ProtocolError, TimeoutError, relay.BodyError) as exc:
            up.close()
            await self._failed(down, record, exc, head.method == "HEAD")
            return False
        up.settle(pod)
        self._log(record)
        self.pool.park(fwd.authority, up)  # closed instead if it cannot take another
        return ok and down.reusable()

    async def _forward_plain(
        self,
        down: Downstream,
        plain: PlainRequest,
        head: RequestHead,
        fwd: Forward,
        record: AccessRecord,
        parked: Upstream | None = None,
    ) -> bool:
        """Relay a plain request; the access-log fields other than its id are filled once the pod has it.
        `parked`: the pod connection the callbacks took from the pool, when they hand the request over."""
        try:
            up = parked or await self._upstream(fwd, record)
        except UpstreamFailure as failure:  # answered as h11 answers it, from the same bytes
            record.describe(head)
            stream = down.judge()
            stream.conn.next_event()  # the request, read again: h11 is now where it would have been
            if more := await self._unreachable(stream, head, fwd, record, failure):
                down.resume(stream)
            return more
        record.upstream_host = up.addr  # (as _upstream sets it, for a parked connection the callbacks took)
        del down.pending[: plain.size]
        fields = upstream_fields(head, fwd, record.request_id)
        exchange = plain_relay.exchange(
            down, up, plain, request_bytes(plain.method, fwd.path, fields), record, self.stream_idle_timeout
        )
        return await self.plain_exchanged(down, up, plain, head, fwd, record, exchange)

    async def plain_exchanged(
        self,
        down: Downstream,
        up: Upstream,
        plain: PlainRequest,
        head: RequestHead,
        fwd: Forward,
        record: AccessRecord,
        exchange: Coroutine[Any, Any, bool],
    ) -> bool:
        """A plain request's `exchange` (begun here or in the connection's callbacks) to its end: logged, and
        the pod connection parked again or closed."""
        failed: BaseException | None = None
        try:
            ok = await exchange
        except (ConnectionError, h11.ProtocolError, TimeoutError, relay.BodyError) as exc:
            failed = exc
        record.describe(head)
        if failed is not None:
            up.close()
            await self._failed(down.answering(plain.method, plain.keep_alive), record, failed, False)
            return False
        self.plain_logged(record, fwd, up)
        return ok and plain.keep_alive

    def plain_logged(self, record: AccessRecord, fwd: Forward, up: Upstream) -> None:
        """A plain request's exchange that went out whole: its access-log line, its pod connection parked."""
        self._log(record)
        self.pool.park(fwd.authority, up)

    async def _failed(
        self, down: H11Stream, record: AccessRecord, exc: BaseException, head_request: bool
    ) -> None:
        """A forwarded exchange that broke: answer if nothing was sent yet, and log it either way."""
        log.debug("exchange %s failed: %s: %s", record.request_id, type(exc).__name__, exc)
        if isinstance(exc, relay.BodyError):
            reject = Reject(exc.status, "DPE", "malformed request body", close=True)
        elif isinstance(exc, TimeoutError):
            reject = Reject(408, "SI", "stream timeout", close=True)
        elif isinstance(exc, DownstreamClosed):
            reject = Reject(0, "DC", "worker connection closed mid-request", close=True)
        else:  # the pod closed, reset or broke its framing
            reject = Reject(503, "UC", UPSTREAM_CLOSED, close=True)
        self.ctx.events.emit(
            "proxy.stream.failed",
            requestId=record.request_id,
            flag=reject.flag,
            reason=UPSTREAM_CLOSED if reject.flag == "UC" else reject.reason,
        )
        if record.status == 0 and reject.status:
            if reject.flag == "UC":  # the worker reads Envoy's reset text; the log and event say why
                reject = Reject(503, "UC", UC_BODY, close=True)
            await self._local_reply(down, record, reject, head_request)
        else:  # the response had started, or nobody is left to answer: the stream is still logged
            record.flags = reject.flag
            self._log(record)

    async def _tunnel(self, down: H11Stream, tunnel: Tunnel, record: AccessRecord) -> None:
        try:
            ip = await self._resolve(tunnel.host)
            record.upstream_host = f"{ip}:{tunnel.port}"
            reader, writer = await self.ctx.open_tcp(ip, tunnel.port)
        except (UpstreamFailure, OSError, TimeoutError) as exc:
            failure = (
                exc if isinstance(exc, UpstreamFailure) else dial_failure(exc, f"{tunnel.host}:{tunnel.port}")
            )
            await self._local_reply(down, record, Reject(503, failure.flag, failure.body, close=True))
            return
        established = [("date", http_date(time.time())), ("server", "envoy")]
        await down.send(h11.Response(status_code=200, headers=established, reason=reason(200)))
        leftover, _ = down.conn.trailing_data
        if leftover:
            writer.write(leftover)
        record.status = 200
        moved = await splice((down.reader, down.writer), (reader, writer), self.connection_idle_timeout)
        record.bytes_received, record.bytes_sent = moved.up + len(leftover), moved.down
        if moved.idle:
            log.info(
                "CONNECT tunnel to %s closed: idle timeout (%g s)",
                record.upstream_host,
                self.connection_idle_timeout,
            )
        self._log(record)
