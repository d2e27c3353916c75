"""The proxy's HTTP/1.1 front: TLS on the 10084 listener, forward-proxy requests relayed to pods.

Bytes and timeouts only; every routing decision comes from sim.proxy.policy.decide.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import uuid
from urllib.parse import urlsplit

import h11

from dns.client import NameNotResolved
from sim.protocols.http1 import READ_SIZE, H11Stream, decode_headers, respond
from sim.protocols.tls import ReloadingContext
from sim.protocols.wire import UF_BODY, UF_TLS_BODY, UpstreamFailure
from sim.proxy.access_log import AccessLog, AccessRecord
from sim.proxy.policy import Decision, Forward, ProxyPolicy, Reject, RequestHead, Tunnel, decide
from sim.runtime.component import Context, connection_handler

HOP_BY_HOP = {"connection", "proxy-connection", "keep-alive", "te", "upgrade", "proxy-authorization",
              "transfer-encoding", "content-length"}
DNS_CACHE_TTL = 5.0
MAX_IDLE_PER_AUTHORITY = 64
Pool = dict[str, tuple[H11Stream, str]]  # authority -> (upstream connection, upstream ip:port)


def request_head(event: h11.Request) -> RequestHead:
    """What decide() sees of a parsed request (shared with the property tests, so they judge this path)."""
    return RequestHead(method=event.method.decode("latin-1"), target=event.target.decode("latin-1"),
                       http_version=event.http_version.decode("latin-1"),
                       headers=tuple(decode_headers(event.headers)))


class HttpFront:
    def __init__(self, ctx: Context, policy: ProxyPolicy, access_log: AccessLog,
                 frontend: ReloadingContext, upstream_trust: ReloadingContext,
                 stream_idle_timeout: float = 300.0):
        self.ctx, self.policy, self.access_log = ctx, policy, access_log
        self.frontend, self.upstream_trust = frontend, upstream_trust
        self.stream_idle_timeout = stream_idle_timeout
        self.server: asyncio.Server | None = None
        self._dns_cache: dict[str, tuple[float, str]] = {}
        # Upstream connections parked by finished downstream connections, shared as Envoy's pool is:
        # authority -> [(connection, upstream ip:port, trust generation it was verified with)].
        self._idle: dict[str, list[tuple[H11Stream, str, int]]] = {}

    async def start(self) -> int:
        self.server = await asyncio.start_server(connection_handler(self._serve), "127.0.0.1", 0,
                                                 ssl=self.frontend.sni_switcher(), ssl_handshake_timeout=10)
        return self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        down = H11Stream(h11.SERVER, reader, writer)
        pool: Pool = {}
        try:
            while await self._one_request(down, pool):
                down.next_cycle()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, TimeoutError):
            pass
        finally:
            for authority, (up, addr) in pool.items():
                self._park(authority, up, addr)
            writer.close()

    def _park(self, authority: str, up: H11Stream, addr: str) -> None:
        idle = self._idle.setdefault(authority, [])
        if up.reusable() and not up.writer.is_closing() and len(idle) < MAX_IDLE_PER_AUTHORITY:
            idle.append((up, addr, self.upstream_trust.generation))
        else:
            up.close()

    def _checkout(self, authority: str) -> tuple[H11Stream, str] | None:
        """A parked upstream connection still open and verified with the current trust, if any."""
        self.upstream_trust.current()  # notice a rotated CA before choosing
        idle = self._idle.get(authority) or []
        while idle:
            up, addr, generation = idle.pop()
            if generation == self.upstream_trust.generation and not up.writer.is_closing() \
                    and not up.reader.at_eof():
                return up, addr
            up.close()
        return None

    async def _one_request(self, down: H11Stream, pool: Pool) -> bool:
        """Serve one request; True when the connection can take another."""
        record = AccessRecord(start=time.time(), forwarded_for="-")
        try:
            event = await self._next_head(down)
        except h11.RemoteProtocolError as exc:
            record.status, record.flags = exc.error_status_hint, "DPE"
            await self._local_reply(down, record, Reject(exc.error_status_hint, "DPE", str(exc), close=True))
            return False
        except TimeoutError:
            await self._local_reply(down, record, Reject(408, "SI", "stream timeout", close=True))
            return False
        if isinstance(event, h11.ConnectionClosed):
            return False
        assert isinstance(event, h11.Request)
        head = request_head(event)
        self._fill_record(record, head)
        decision = decide(head, self.policy)
        if not isinstance(decision, Forward):  # a forwarded request is on record in the access log line
            self.ctx.events.emit("proxy.decision", requestId=record.request_id, target=head.target,
                                 method=head.method, decision=type(decision).__name__,
                                 status=getattr(decision, "status", None), flag=getattr(decision, "flag", None),
                                 reason=getattr(decision, "reason", None))
        return await self._dispatch(down, pool, head, decision, record)

    async def _next_head(self, down: H11Stream) -> h11.Event:
        """The next request head. An idle keep-alive connection may wait (Envoy's connection idle timeout is
        an hour), but once a request's first bytes arrived its stream exists, and a client that then goes
        quiet for the stream idle timeout gets 408 SI, as Envoy answers a slow-loris head."""
        while (event := down.conn.next_event()) is h11.NEED_DATA:
            started = bool(down.conn.trailing_data[0])
            data = await asyncio.wait_for(down.reader.read(READ_SIZE),
                                          self.stream_idle_timeout if started else None)
            down.conn.receive_data(data)  # b"" is EOF: ConnectionClosed, or RemoteProtocolError mid-head
        return event

    async def _dispatch(self, down: H11Stream, pool: Pool, head: RequestHead,
                        decision: Decision, record: AccessRecord) -> bool:
        if isinstance(decision, Reject):
            await self._local_reply(down, record, decision)
            return not decision.close and await self._drain(down)
        if isinstance(decision, Tunnel):
            await self._tunnel(down, decision, record)
            return False
        return await self._forward(down, pool, head, decision, record)

    def _fill_record(self, record: AccessRecord, head: RequestHead) -> None:
        record.method, record.protocol = head.method, f"HTTP/{head.http_version}"
        if head.method == "CONNECT":
            record.path, record.authority = "-", head.target
        elif "://" in head.target:
            try:
                parts = urlsplit(head.target)
                record.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                record.authority = parts.netloc
            except ValueError:  # "http://[": logged as sent; decide() answers it 400
                record.path, record.authority = head.target, "-"
        else:
            record.path, record.authority = head.target, head.header("host") or "-"
        record.user_agent = head.header("user-agent") or "-"
        record.request_id = head.header("x-request-id") or str(uuid.uuid4())

    async def _local_reply(self, down: H11Stream, record: AccessRecord, reject: Reject) -> None:
        record.status, record.flags = reject.status, reject.flag
        body = b"" if reject.status == 404 else reject.reason.encode()
        with contextlib.suppress(h11.LocalProtocolError, ConnectionError):
            await respond(down, reject.status, body, [("server", "envoy")], close=reject.close)
        self._log(record, down)

    async def _drain(self, down: H11Stream) -> bool:
        """Read the rest of a rejected request so the connection can be reused."""
        while down.conn.their_state is h11.SEND_BODY:
            event = await down.next_event(self.stream_idle_timeout)
            if isinstance(event, h11.ConnectionClosed):
                return False
        return down.reusable()

    def _log(self, record: AccessRecord, down: H11Stream) -> None:
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
            raise UpstreamFailure("DF", "dns resolution failure", f"{host}: {exc.rcode}") from exc
        self._dns_cache[host] = (now + DNS_CACHE_TTL, ip)
        return ip

    async def _connect(self, host: str, port: int, tls: bool) -> tuple[H11Stream, str]:
        ip = await self._resolve(host)
        try:
            reader, writer = await self.ctx.open_tcp(
                ip, port, tls=self.upstream_trust.current() if tls else None, server_hostname=host)
        except ssl.SSLCertVerificationError as exc:
            raise UpstreamFailure("UF", UF_TLS_BODY, f"CERTIFICATE_VERIFY_FAILED: {exc.verify_message}") from exc
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise UpstreamFailure("UF", UF_BODY, f"{type(exc).__name__}: {exc}") from exc
        return H11Stream(h11.CLIENT, reader, writer), f"{ip}:{port}"

    async def _forward(self, down: H11Stream, pool: Pool, head: RequestHead,
                       fwd: Forward, record: AccessRecord) -> bool:
        started = time.monotonic()
        pooled = pool.get(fwd.authority)
        if pooled is None and (parked := self._checkout(fwd.authority)) is not None:
            pooled = pool[fwd.authority] = parked
        try:
            if pooled is None or not pooled[0].reusable():
                pooled = pool[fwd.authority] = await self._connect(fwd.host, fwd.port, fwd.tls)
            else:
                pooled[0].next_cycle()
        except UpstreamFailure as failure:
            self.ctx.events.emit("proxy.upstream.failed", requestId=record.request_id, host=fwd.host,
                                 flag=failure.flag, detail=failure.detail)
            await self._local_reply(down, record, Reject(503, failure.flag, failure.body))
            return await self._drain(down)
        up, record.upstream_host = pooled
        headers = [(k, v) for k, v in head.headers if k not in HOP_BY_HOP and k != "host"]
        headers = [("host", fwd.authority), *headers, ("x-forwarded-proto", "https")]
        if head.header("x-request-id") is None:
            headers.append(("x-request-id", record.request_id))
        if head.header("content-length") is not None:
            headers.append(("content-length", head.header("content-length") or "0"))
        elif head.header("transfer-encoding") is not None:
            headers.append(("transfer-encoding", "chunked"))
        return await self._relay(down, up, h11.Request(method=head.method, target=fwd.path, headers=headers),
                                 record, started, pool, fwd.authority)

    async def _relay(self, down: H11Stream, up: H11Stream, request: h11.Request, record: AccessRecord,
                     started: float, pool: Pool, authority: str) -> bool:
        request_pump: asyncio.Task[None] | None = None
        response_pump: asyncio.Task[bool] | None = None
        body_error: h11.RemoteProtocolError | None = None
        try:
            try:
                buffered, complete = self._buffered_body(down, record)
            except h11.RemoteProtocolError as exc:
                body_error = exc
                raise
            if complete:
                # The whole request is here (a worker's GET or POST, usually): head and body in one write,
                # and no pump tasks, since nothing more can arrive that the response has to race.
                await up.send(request, *buffered)
                ok = await self._pump_response(down, up, record, started)
            else:
                request_pump = asyncio.create_task(self._pump_body(down, up, record), name="proxy-request-body")
                await up.send(request, *buffered)
                response_pump = asyncio.create_task(self._pump_response(down, up, record, started),
                                                    name="proxy-response")
                # Whichever side fails first ends the exchange: a malformed or stalled request body must
                # not wait out the response, which the pod cannot send before it has that body.
                await asyncio.wait({request_pump, response_pump}, return_when=asyncio.FIRST_EXCEPTION)
                for task in (request_pump, response_pump):
                    if task.done() and (failure := task.exception()) is not None:
                        raise failure
                ok = await response_pump
                await request_pump
        except (ConnectionError, h11.ProtocolError, TimeoutError) as exc:
            pool.pop(authority, None)
            up.close()
            if isinstance(exc, TimeoutError):
                status, flag, reason = 408, "SI", "stream timeout"
            elif isinstance(exc, h11.RemoteProtocolError) and (exc is body_error or (request_pump is not None and _raised(request_pump, exc))):
                # The worker's body broke the codec: Envoy answers with the codec's status.
                status, flag, reason = exc.error_status_hint, "DPE", str(exc)
            else:
                status, flag, reason = 503, "UC", "upstream reset"
            if record.status == 0:
                await self._local_reply(down, record, Reject(status, flag, reason, close=True))
            else:  # the response had started: nothing to answer, but the stream is still logged
                record.flags = flag
                self._log(record, down)
            return False
        finally:
            for task in (request_pump, response_pump):
                if task is not None and not task.done():
                    task.cancel()
        self._log(record, down)
        if not up.reusable():
            pool.pop(authority, None)
            up.close()
        return ok and down.reusable()

    @staticmethod
    def _buffered_body(down: H11Stream, record: AccessRecord) -> tuple[list[h11.Event], bool]:
        """The request body events already received; True when they include the end of the message."""
        events: list[h11.Event] = []
        while (event := down.conn.next_event()) is not h11.NEED_DATA:
            if isinstance(event, h11.Data):
                record.bytes_received += len(event.data)
                events.append(h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                return [*events, h11.EndOfMessage()], True
            else:
                raise ConnectionResetError("downstream closed mid-request")
        return events, False

    async def _pump_body(self, down: H11Stream, up: H11Stream, record: AccessRecord) -> None:
        while True:
            event = await down.next_event(self.stream_idle_timeout)
            if isinstance(event, h11.Data):
                record.bytes_received += len(event.data)
                await up.send(h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                await up.send(h11.EndOfMessage())
                return
            else:
                raise ConnectionResetError("downstream closed mid-request")

    async def _pump_response(self, down: H11Stream, up: H11Stream, record: AccessRecord,
                             started: float) -> bool:
        sent_before = down.bytes_out
        while True:
            # Relay what one read brought (typically head, body and end together) in one write.
            events = [await up.next_event(self.stream_idle_timeout)]
            while type(events[-1]) in (h11.Response, h11.InformationalResponse, h11.Data) \
                    and (more := up.conn.next_event()) is not h11.NEED_DATA:
                events.append(more)
            out: list[h11.Event] = []
            for event in events:
                if isinstance(event, h11.Response):
                    out.append(self._response_head(event, record, started))
                elif isinstance(event, h11.Data):
                    out.append(h11.Data(data=event.data))
                elif isinstance(event, h11.EndOfMessage):
                    await down.send(*out, h11.EndOfMessage())
                    record.bytes_sent = down.bytes_out - sent_before
                    return True
                elif not isinstance(event, h11.InformationalResponse):
                    raise ConnectionResetError("upstream closed mid-response")
            if out:
                await down.send(*out)

    def _response_head(self, event: h11.Response, record: AccessRecord, started: float) -> h11.Response:
        record.status = event.status_code
        record.upstream_service_time = str(int((time.monotonic() - started) * 1000))
        headers = [(k, v) for k, v in decode_headers(event.headers) if k not in ("server", "connection")]
        headers += [("server", "envoy"), ("x-envoy-upstream-service-time", record.upstream_service_time)]
        return h11.Response(status_code=event.status_code, headers=headers)

    async def _tunnel(self, down: H11Stream, tunnel: Tunnel, record: AccessRecord) -> None:
        try:
            ip = await self._resolve(tunnel.host)
            reader, writer = await self.ctx.open_tcp(ip, tunnel.port)
        except (UpstreamFailure, OSError, TimeoutError) as exc:
            flag = exc.flag if isinstance(exc, UpstreamFailure) else "UF"
            await self._local_reply(down, record, Reject(503, flag, UF_BODY, close=True))
            return
        record.upstream_host = f"{ip}:{tunnel.port}"
        await down.send(h11.Response(status_code=200, headers=[("server", "envoy")]))
        leftover, _ = down.conn.trailing_data
        if leftover:
            writer.write(leftover)
        record.status = 200
        await _splice(down.reader, down.writer, reader, writer)
        self._log(record, down)


def _raised(task: asyncio.Task, exc: BaseException) -> bool:
    return task.done() and not task.cancelled() and task.exception() is exc


async def _splice(r1: asyncio.StreamReader, w1: asyncio.StreamWriter, r2: asyncio.StreamReader,
                  w2: asyncio.StreamWriter) -> None:
    """Copy bytes both ways until either side closes (the CONNECT tunnel)."""

    async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        with contextlib.suppress(OSError, RuntimeError):
            if dst.can_write_eof():
                dst.write_eof()

    await asyncio.gather(asyncio.create_task(copy(r1, w2), name="tunnel-up"),
                         asyncio.create_task(copy(r2, w1), name="tunnel-down"))
    w2.close()
