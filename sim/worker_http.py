"""The HTTP callback of worker-utils: GET the request, run the function, POST the response.

Current worker-utils (1.3.2+) send the http:// pod target as a forward-proxy request inside their TLS
session to the proxy; older ones send CONNECT and run their own TLS to the pod through the tunnel.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import h11

from dns.client import NameNotResolved
from sim.http1 import H11Stream, PeerClosed, Response, exchange
from sim.invocation_core import H1_TYPE

if TYPE_CHECKING:
    from sim.worker import WorkerRuntime

ATTACH_PATH = "/v2/nvcf/worker/request-attach"
GET_HEADERS_TIMEOUT = 5.0  # worker-utils waits 5 s for the GET's response headers


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
    out = conn.send(h11.Response(status_code=200, headers=[("content-type", content_type),
                                                           ("content-length", str(len(body)))])) or b""
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


async def _dial(worker: WorkerRuntime, ip: str, port: int, tls: ssl.SSLContext | None,
                server_hostname: str | None) -> H11Stream:
    try:
        reader, writer = await worker.ctx.open_tcp(ip, port, tls=tls, server_hostname=server_hostname)
    except ssl.SSLCertVerificationError as exc:
        raise CallbackFailed("tls", f"TLS handshake failed: {exc.verify_message}") from exc
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        raise CallbackFailed("connect", f"{type(exc).__name__}: {exc}") from exc
    return H11Stream(h11.CLIENT, reader, writer)


async def _connect_tunnel(worker: WorkerRuntime, stream: H11Stream, pod_host: str, trace: Trace) -> H11Stream:
    """Legacy worker-utils: CONNECT to the pod's 8443, then TLS to the pod inside the tunnel."""
    authority = f"{pod_host}:8443"
    await stream.send(h11.Request(method="CONNECT", target=authority, headers=[("host", authority)]))
    event = await stream.next_event(GET_HEADERS_TIMEOUT)
    status = getattr(event, "status_code", 0)
    trace.statuses.append(status)
    if status != 200:
        raise CallbackFailed("connect", f"CONNECT {authority} answered {status}", status)
    try:
        await stream.writer.start_tls(worker.client_context(), server_hostname=pod_host)
    except ssl.SSLCertVerificationError as exc:
        raise CallbackFailed("tls", f"TLS handshake with the pod failed: {exc.verify_message}") from exc
    return H11Stream(h11.CLIENT, stream.reader, stream.writer)


async def callback(worker: WorkerRuntime, work: dict[str, Any], trace: Trace) -> None:
    stream = await open_session(worker, work, trace)
    try:
        tunnelled = worker.sends_connect and bool(work.get("proxyURI"))
        url = (ATTACH_PATH if tunnelled else work["targetURI"].rstrip("/") + ATTACH_PATH)
        base = [("host", urlsplit(work["targetURI"]).netloc), ("user-agent", f"worker-utils/{worker.spec.worker_utils}"),
                ("x-request-id", work["requestId"])]
        got = await _leg(stream, "GET", url, base + [("authorization", f"Bearer {work['requestToken']}"),
                                                     ("accept", f"{H1_TYPE}, application/octet-stream")],
                         b"", trace, "get")
        answer = echo_function(got.body)
        await _leg(stream, "POST", url, base + [("authorization", f"Bearer {work['responseToken']}"),
                                                ("content-type", H1_TYPE)], answer, trace, "post")
    finally:
        stream.close()


async def _leg(stream: H11Stream, method: str, url: str, headers: list[tuple[str, str]], body: bytes,
               trace: Trace, stage: str) -> Response:
    try:
        timeout = GET_HEADERS_TIMEOUT if method == "GET" else None
        response = await exchange(stream, method, url, headers, body, timeout=timeout)
    except (PeerClosed, ConnectionError, h11.ProtocolError, TimeoutError) as exc:
        raise CallbackFailed(stage, f"{type(exc).__name__}: {exc}") from exc
    trace.statuses.append(response.status)
    if response.status != 200:
        raise CallbackFailed(stage, f"{method} answered {response.status}: {response.body[:200].decode(errors='replace')}",
                             response.status)
    return response


async def handle_http_work(worker: WorkerRuntime, work: dict[str, Any]) -> None:
    trace = Trace(work["requestId"], worker.name)
    events = worker.ctx.events
    events.emit("worker.callback.start", requestId=trace.request_id, worker=worker.name, callback="http",
                target=work["targetURI"], proxy=work.get("proxyURI"), connect=worker.sends_connect)
    result: dict[str, Any] = {"ok": True, "stage": "done", "error": None, "status": 200}
    try:
        await callback(worker, work, trace)
    except CallbackFailed as failure:
        result = {"ok": False, "stage": failure.stage, "error": failure.error, "status": failure.status}
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a worker bug must show in the report, not kill the worker host
        result = {"ok": False, "stage": "worker", "error": f"{type(exc).__name__}: {exc}", "status": None}
    events.emit("worker.callback.result", requestId=trace.request_id, worker=worker.name, callback="http",
                dns=trace.dns, statuses=trace.statuses,
                elapsedMs=int((time.monotonic() - trace.started) * 1000), **result)
