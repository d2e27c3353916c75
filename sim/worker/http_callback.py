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
from sim.protocols.http1 import ClosedBeforeResponse, H11Stream, PeerClosed, Response, exchange
from sim.protocols.request_attach import H1_TYPE, token_fingerprint
from sim.protocols.tls_in_tls import TunnelTls
from sim.protocols.wire import ATTACH_PATH, INVOCATION_TLS_PORT
from sim.worker import log as worker_log

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
    connections: list[str] = field(default_factory=list)  # per leg: "new" (dialed) or "reused" (kept alive)
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Route:
    """Where a callback's legs go, and the key Go's Transport pools their connections under: the proxy URL
    for a forward-proxy request, the target's scheme, host and port without a proxy."""

    key: str
    host: str  # the name the worker resolves and dials
    port: int
    tls: bool  # TLS to the proxy; a pod straight in the same cluster is plain HTTP


def route_of(work: dict[str, Any]) -> Route:
    proxy, target = work.get("proxyURI") or "", urlsplit(work["targetURI"])
    if not proxy:
        return Route(f"{target.scheme}://{target.netloc}", target.hostname or "", target.port or 80, False)
    proxy_url = urlsplit(proxy)
    return Route(proxy, proxy_url.hostname or "", proxy_url.port or 443, True)


async def resolve(worker: WorkerRuntime, host: str, trace: Trace) -> str:
    try:
        ip = (await worker.ctx.resolve(host))[0]
    except NameNotResolved as exc:
        trace.dns = {"name": host, "rcode": exc.rcode}
        raise CallbackFailed("dns", f"cannot resolve {host}: {exc.rcode}") from exc
    trace.dns = {"name": host, "answer": ip}
    return ip


async def connection(worker: WorkerRuntime, route: Route, method: str, trace: Trace) -> tuple[H11Stream, str]:
    """A kept-alive connection of this worker's along `route`, else a new one (DNS lookup, TLS handshake).
    Returns it with the virtual address it leads to; `trace.connections` says which it was."""
    idle = worker.pool.take(route.key)
    if idle is None:
        trace.connections.append("new")
        ip = await resolve(worker, route.host, trace)
        tls = worker.client_context() if route.tls else None
        return await _dial(worker, ip, route.port, tls, route.host if route.tls else None), ip
    trace.connections.append("reused")
    try:
        await worker.ctx.cross_link(idle.ip)  # a faulty link delays or loses each request, not just dials
    except TimeoutError as exc:
        idle.stream.close()  # worker-utils gives the request up, and Go closes the connection it was on
        raise CallbackFailed(method.lower(), f"{method} failed: {exc}") from exc
    return idle.stream, idle.ip


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
        raise CallbackFailed(
            "tls", f"TLS handshake with the pod failed: certificate verify failed ({exc.verify_message})"
        ) from exc
    except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
        raise CallbackFailed(
            "tls", f"TLS handshake with the pod failed: {type(exc).__name__}: {exc}"
        ) from exc
    return H11Stream(h11.CLIENT, inner, inner)  # type: ignore[arg-type]  # stream-shaped, see TunnelTls


async def callback(worker: WorkerRuntime, work: dict[str, Any], trace: Trace) -> None:
    """GET the client's request, run the function, POST its response: each leg on a connection from the
    worker's pool (worker-utils 1.3.2+), or both inside one CONNECT tunnel of their own (older ones)."""
    if worker.sends_connect:
        await _tunneled_callback(worker, work, trace)
        return
    route = route_of(work)
    # Absolute-form only as a forward-proxy request; straight to the pod the request line carries the path.
    url = work["targetURI"].rstrip("/") + ATTACH_PATH if work.get("proxyURI") else ATTACH_PATH
    got = await _pooled_leg(worker, route, "GET", url, _get_headers(worker, work), b"", trace)
    await _pooled_leg(worker, route, "POST", url, _post_headers(worker, work), echo_function(got.body), trace)


def _base_headers(worker: WorkerRuntime, work: dict[str, Any]) -> list[tuple[str, str]]:
    # No X-Request-Id, as the public worker-utils source sends none: the proxy's access log shows the id
    # the proxy generated, and the replay links it to this callback through the pod's events.
    return [
        ("host", urlsplit(work["targetURI"]).netloc),
        ("user-agent", f"worker-utils/{worker.spec.worker_utils}"),
    ]


def _get_headers(worker: WorkerRuntime, work: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        *_base_headers(worker, work),
        ("authorization", f"Bearer {work['requestToken']}"),
        ("accept", f"{H1_TYPE}, application/octet-stream"),
    ]


def _post_headers(worker: WorkerRuntime, work: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        *_base_headers(worker, work),
        ("authorization", f"Bearer {work['responseToken']}"),
        ("content-type", H1_TYPE),
    ]


async def _pooled_leg(
    worker: WorkerRuntime,
    route: Route,
    method: str,
    url: str,
    headers: list[tuple[str, str]],
    body: bytes,
    trace: Trace,
) -> Response:
    """One leg on a pooled connection, which goes back to the pool once its exchange is complete. A GET that
    a kept-alive connection lost before any byte of an answer is sent again on another one, as Go's
    Transport retries an idempotent request (the server closed an idle connection as it was reused)."""
    while True:
        stream, ip = await connection(worker, route, method, trace)
        try:
            response = await _send(stream, method, url, headers, body)
        except BaseException as exc:  # a cancelled leg closes its connection too
            stream.close()
            lost_idle = trace.connections[-1] == "reused" and isinstance(exc.__cause__, ClosedBeforeResponse)
            if method == "GET" and lost_idle:
                continue
            raise
        worker.pool.give(route.key, stream, ip)
        return _answered(response, method, trace)


async def _tunneled_callback(worker: WorkerRuntime, work: dict[str, Any], trace: Trace) -> None:
    """Legacy worker-utils: CONNECT to the pod's 8443 and its own TLS inside, both legs on that session."""
    proxy_url = urlsplit(work["proxyURI"])
    trace.connections.append("new")
    ip = await resolve(worker, proxy_url.hostname or "", trace)
    outer = await _dial(worker, ip, proxy_url.port or 443, worker.client_context(), proxy_url.hostname)
    try:
        stream = await _connect_tunnel(worker, outer, urlsplit(work["targetURI"]).hostname or "", trace)
        get = await _send(stream, "GET", ATTACH_PATH, _get_headers(worker, work), b"")
        answer = echo_function(_answered(get, "GET", trace).body)
        post = await _send(stream, "POST", ATTACH_PATH, _post_headers(worker, work), answer)
        _answered(post, "POST", trace)
    finally:
        outer.close()  # the worker's own TLS session inside the tunnel goes with it


async def _send(
    stream: H11Stream, method: str, url: str, headers: list[tuple[str, str]], body: bytes
) -> Response:
    try:
        timeout = GET_HEADERS_TIMEOUT if method == "GET" else None
        return await exchange(stream, method, url, headers, body, timeout=timeout)
    except (PeerClosed, ConnectionError, h11.ProtocolError, TimeoutError) as exc:
        log.debug("%s %s failed: %s: %s", method, url, type(exc).__name__, exc)
        failure = leg_failure(exc, stream.reader.at_eof())
        raise CallbackFailed(method.lower(), f"{method} failed: {failure}") from exc


def _answered(response: Response, method: str, trace: Trace) -> Response:
    trace.statuses.append(response.status)
    if response.status != 200:
        raise CallbackFailed(
            method.lower(),
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
    if isinstance(exc, ClosedBeforeResponse):
        return str(exc)
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
        connections=trace.connections,
        elapsedMs=int((time.monotonic() - trace.started) * 1000),
        **result,
    )
    worker_log.callback_failed(worker.name, "http", {**result, "requestId": trace.request_id})
