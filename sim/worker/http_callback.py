"""The HTTP callback of worker-utils: GET the request, run the function, POST the response.

Current worker-utils (1.3.2+) send the http:// pod target as a forward-proxy request inside their TLS
session to the proxy; older ones send CONNECT and run their own TLS to the pod through the tunnel.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import h11

from dns.client import NameNotResolved
from sim.protocols.http1 import H11Stream, PeerClosed, Response, exchange
from sim.protocols.request_attach import H1_TYPE, token_fingerprint
from sim.protocols.wire import ATTACH_PATH, INVOCATION_TLS_PORT

if TYPE_CHECKING:
    from sim.worker.host import WorkerRuntime

GET_HEADERS_TIMEOUT = 5.0  # worker-utils waits 5 s for the GET's response headers
log = logging.getLogger("ncpsim.worker.http")


class CallbackFailed(Exception):
    def __init__(self, stage: str, error: str, status: int | None = None):
        super().__init__(f"{stage}: {error}")
        self.stage, self.error, self.status = stage, error, status


def echo_function(raw_request: bytes) -> bytes:
    """The echo function: answers with the request's body and content type, as an HTTP/1.1 message."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw_request)
    conn.receive_data(b"")
    content_type, chunks = "application/octet-stream", []
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Request):
            content_type = next((v.decode() for k, v in event.headers if k == b"content-type"), content_type)
        elif isinstance(event, h11.Data):
            chunks.append(bytes(event.data))
        else:
            break
    body = b"".join(chunks)
    out = (
        conn.send(
            h11.Response(
                status_code=200, headers=[("content-type", content_type), ("content-length", str(len(body)))]
            )
        )
        or b""
    )
    return out + (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")


@dataclass
class Trace:
    """What the worker saw, for the replay report."""

    request_id: str
    worker: str
    kind: str = "http"
    dns: dict[str, Any] = field(default_factory=dict)
    statuses: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)


async def resolve(worker: WorkerRuntime, host: str, trace: Trace) -> str:
    try:
        ip = (await worker.ctx.resolve(host))[0]
    except NameNotResolved as exc:
        trace.dns = {"name": host, "rcode": exc.rcode}
        raise CallbackFailed("dns", f"cannot resolve {host}: {exc.rcode}") from exc
    trace.dns = {"name": host, "answer": ip}
    return ip


async def open_session(worker: WorkerRuntime, work: dict[str, Any], trace: Trace) -> H11Stream:
    """A connection on which the callback's requests go: through the proxy, or straight to the pod."""
    proxy, target = work.get("proxyURI") or "", urlsplit(work["targetURI"])
    if not proxy:
        ip = await resolve(worker, target.hostname or "", trace)
        return await _dial(worker, ip, target.port or 80, None, None)
    proxy_url = urlsplit(proxy)
    ip = await resolve(worker, proxy_url.hostname or "", trace)
    stream = await _dial(worker, ip, proxy_url.port or 443, worker.client_context(), proxy_url.hostname)
    if worker.sends_connect:
        stream = await _connect_tunnel(worker, stream, target.hostname or "", trace)
    return stream


async def _dial(
    worker: WorkerRuntime, ip: str, port: int, tls: ssl.SSLContext | None, server_hostname: str | None
) -> H11Stream:
    try:
        reader, writer = await worker.ctx.open_tcp(ip, port, tls=tls, server_hostname=server_hostname)
    except ssl.SSLCertVerificationError as exc:
        raise CallbackFailed(
            "tls", f"TLS handshake failed: certificate verify failed ({exc.verify_message})"
        ) from exc
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        raise CallbackFailed("connect", f"{type(exc).__name__}: {exc}") from exc
    return H11Stream(h11.CLIENT, reader, writer)


async def _connect_tunnel(worker: WorkerRuntime, stream: H11Stream, pod_host: str, trace: Trace) -> H11Stream:
    """Legacy worker-utils: CONNECT to the pod's 8443, then TLS to the pod inside the tunnel."""
    authority = f"{pod_host}:{INVOCATION_TLS_PORT}"
    # No X-Request-Id: worker-utils sends none, so the proxy's log line carries the proxy's own id.
    headers = [("host", authority), ("user-agent", f"worker-utils/{worker.spec.worker_utils}")]
    await stream.send(h11.Request(method="CONNECT", target=authority, headers=headers))
    event = await stream.next_event(GET_HEADERS_TIMEOUT)
    status = getattr(event, "status_code", 0)
    trace.statuses.append(status)
    if status != 200:
        raise CallbackFailed("connect", f"CONNECT {authority} answered {status}", status)
    inner = TunnelTls(stream.reader, stream.writer, worker.client_context(), pod_host)
    try:
        await inner.handshake(GET_HEADERS_TIMEOUT)
    except ssl.SSLCertVerificationError as exc:
        stream.close()
        raise CallbackFailed(
            "tls", f"TLS handshake with the pod failed: certificate verify failed ({exc.verify_message})"
        ) from exc
    except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
        stream.close()
        raise CallbackFailed(
            "tls", f"TLS handshake with the pod failed: {type(exc).__name__}: {exc}"
        ) from exc
    return H11Stream(h11.CLIENT, inner, inner)  # type: ignore[arg-type]  # stream-shaped, see TunnelTls


class TunnelTls:
    """The worker's own TLS session to the pod, run over the proxy's TLS session (TLS in TLS).

    Python 3.11's StreamWriter.start_tls over an SSL transport works until the inner handshake fails;
    then asyncio raises TypeError (SSLProtocol._abort) instead of the verification error. So the inner
    session is an ssl.SSLObject on memory BIOs, pumped over the outer stream. It offers the few stream
    methods H11Stream uses: read, write, drain, close.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        context: ssl.SSLContext,
        server_hostname: str,
    ):
        self.reader, self.writer = reader, writer
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname=server_hostname)
        self.eof = False

    async def handshake(self, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    self.tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    await self._flush()
                    await self._fill()
                except ssl.SSLError:
                    await self._flush()  # send the alert, as a TLS library would, then fail
                    raise
            await self._flush()

    async def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def _fill(self) -> None:
        data = await self.reader.read(65536)
        if data:
            self.incoming.write(data)
        else:
            self.incoming.write_eof()

    async def read(self, size: int) -> bytes:
        while True:
            try:
                return self.tls.read(size)
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self.eof = True
                return b""  # the pod closed the session: EOF, as a stream reader reports it

    def at_eof(self) -> bool:
        return self.eof

    def write(self, data: bytes) -> None:
        self.tls.write(data)
        self.writer.write(self.outgoing.read())

    async def drain(self) -> None:
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


async def callback(worker: WorkerRuntime, work: dict[str, Any], trace: Trace) -> None:
    stream = await open_session(worker, work, trace)
    try:
        # Absolute-form only as a forward-proxy request; to the pod itself (direct, or inside a CONNECT
        # tunnel) the request line carries just the path, as any HTTP client sends it.
        forward = bool(work.get("proxyURI")) and not worker.sends_connect
        url = work["targetURI"].rstrip("/") + ATTACH_PATH if forward else ATTACH_PATH
        # No X-Request-Id, as the public worker-utils source sends none: the proxy's access log shows the id
        # the proxy generated, and the replay links it to this callback through the pod's events.
        base = [
            ("host", urlsplit(work["targetURI"]).netloc),
            ("user-agent", f"worker-utils/{worker.spec.worker_utils}"),
        ]
        got = await _leg(
            stream,
            "GET",
            url,
            base
            + [
                ("authorization", f"Bearer {work['requestToken']}"),
                ("accept", f"{H1_TYPE}, application/octet-stream"),
            ],
            b"",
            trace,
            "get",
        )
        answer = echo_function(got.body)
        await _leg(
            stream,
            "POST",
            url,
            base + [("authorization", f"Bearer {work['responseToken']}"), ("content-type", H1_TYPE)],
            answer,
            trace,
            "post",
        )
    finally:
        stream.close()


async def _leg(
    stream: H11Stream,
    method: str,
    url: str,
    headers: list[tuple[str, str]],
    body: bytes,
    trace: Trace,
    stage: str,
) -> Response:
    try:
        timeout = GET_HEADERS_TIMEOUT if method == "GET" else None
        response = await exchange(stream, method, url, headers, body, timeout=timeout)
    except (PeerClosed, ConnectionError, h11.ProtocolError, TimeoutError) as exc:
        log.debug("%s %s failed: %s: %s", method, url, type(exc).__name__, exc)
        raise CallbackFailed(stage, f"{method} failed: {leg_failure(exc, stream.reader.at_eof())}") from exc
    trace.statuses.append(response.status)
    if response.status != 200:
        raise CallbackFailed(
            stage,
            f"{method} answered {response.status}: {response.body[:200].decode(errors='replace')}",
            response.status,
        )
    return response


def leg_failure(exc: BaseException, closed: bool) -> str:
    """Why a callback leg got no whole answer, in ncpsim's words (h11's own wording stays in the debug log).
    `closed`: the other side had closed the connection (h11 calls a cut-off body a protocol error)."""
    if isinstance(exc, TimeoutError):
        return f"no response headers within {GET_HEADERS_TIMEOUT:g} s"
    if isinstance(exc, h11.LocalProtocolError):
        return "the worker could not frame its request"
    if isinstance(exc, h11.RemoteProtocolError) and not closed:
        return "malformed response"
    if isinstance(exc, PeerClosed) and "before" in str(exc):
        return "connection closed before a response"
    return "connection closed mid-response"


async def handle_http_work(worker: WorkerRuntime, work: dict[str, Any]) -> None:
    trace = Trace(work["requestId"], worker.name)
    events = worker.ctx.events
    tokens = [token_fingerprint(f"Bearer {work.get(key)}") for key in ("requestToken", "responseToken")]
    events.emit(
        "worker.callback.start",
        requestId=trace.request_id,
        worker=worker.name,
        callback="http",
        target=work["targetURI"],
        proxy=work.get("proxyURI"),
        connect=worker.sends_connect,
        tokens=tokens,
    )
    result: dict[str, Any] = {"ok": True, "stage": "done", "error": None, "status": 200}
    try:
        await callback(worker, work, trace)
    except CallbackFailed as failure:
        result = {"ok": False, "stage": failure.stage, "error": failure.error, "status": failure.status}
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a worker bug must show in the report, not kill the worker host
        result = {"ok": False, "stage": "worker", "error": f"{type(exc).__name__}: {exc}", "status": None}
    events.emit(
        "worker.callback.result",
        requestId=trace.request_id,
        worker=worker.name,
        callback="http",
        dns=trace.dns,
        statuses=trace.statuses,
        elapsedMs=int((time.monotonic() - trace.started) * 1000),
        **result,
    )
