"""The HTTP callback of worker-utils: GET the request, run the function, POST the response.

Current worker-utils (1.3.2+) send the http:// pod target as a forward-proxy request inside their TLS
session to the proxy; older ones send CONNECT and run their own TLS to the pod through the tunnel.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import h11

from dns.client import NameNotResolved
from sim.model.events import CALLBACK_RESULT, CALLBACK_START
from sim.model.netmap import Refused, Unreachable
from sim.protocols.go_errors import (
    NO_PROXY_CA,
    Dial,
    connect_status_line,
    http_dial_line,
    leg_broken_line,
    leg_status_line,
)
from sim.protocols.h1plain import head_end, plain_request, response_bytes
from sim.protocols.http1 import ClosedBeforeResponse, H11Stream, PeerClosed, Response, exchange
from sim.protocols.request_attach import H1_TYPE, token_fingerprint
from sim.protocols.tls_in_tls import TunnelTls
from sim.wire import ATTACH_PATH, INVOCATION_TLS_PORT
from sim.worker.runtime import WorkerRuntime, log_failure

GET_HEADERS_TIMEOUT = 5.0  # worker-utils waits 5 s for the GET's response headers
log = logging.getLogger("ncpsim.worker.http")


class CallbackFailed(Exception):
    """A callback that failed: `error` is the line a Go worker logs (sim.protocols.go_errors), `cause`
    ncpsim's own account of what happened, kept in the events beside it."""

    def __init__(self, stage: str, error: str, status: int | None = None, cause: str | None = None):
        super().__init__(f"{stage}: {error}")
        self.stage, self.error, self.status, self.cause = stage, error, status, cause


ECHO_TYPE = "application/octet-stream"  # what the echo answers when the request names no content type


def echo_function(raw_request: bytes) -> bytes:
    """The echo function: answers with the request's body and content type, as an HTTP/1.1 message. A plain
    request (sim.protocols.h1plain) is answered without an h11 pass, in the bytes h11 would have written."""
    end = head_end(raw_request)
    request = plain_request(raw_request[:end]) if end >= 0 else None
    if request is None or not request.keep_alive or len(raw_request) < end + request.length:
        return _echo_h11(raw_request)
    body = raw_request[end : end + request.length]
    content_type = next((v for k, v in request.headers if k == "content-type"), ECHO_TYPE)
    return response_bytes(200, b"", _echo_fields(content_type, body)) + body


def _echo_fields(content_type: str, body: bytes) -> list[tuple[str, str]]:
    return [("content-type", content_type), ("content-length", str(len(body)))]


def _echo_h11(raw_request: bytes) -> bytes:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw_request)
    conn.receive_data(b"")
    content_type, chunks = ECHO_TYPE, []
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Request):
            content_type = next((v.decode() for k, v in event.headers if k == b"content-type"), content_type)
        elif isinstance(event, h11.Data):
            chunks.append(bytes(event.data))
        else:
            break
    body = b"".join(chunks)
    out = conn.send(h11.Response(status_code=200, headers=_echo_fields(content_type, body))) or b""
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


def leg_dial(worker: WorkerRuntime, route: Route, method: str, url: str) -> Dial:
    """What a leg's dial is, as Go's net/http reports a failure of it."""
    return Dial(route.host, worker.dns_address, method=method, url=url, proxied=route.tls)


async def resolve(worker: WorkerRuntime, dial: Dial, port: int, trace: Trace) -> Dial:
    """`dial` with the address its host resolved to, at `port`; the answer (or rcode) goes in the trace."""
    try:
        ip = (await worker.ctx.resolve(dial.host))[0]
    except NameNotResolved as exc:
        trace.dns = {"name": dial.host, "rcode": exc.rcode}
        raise _dial_failed("dns", dial, exc, f"{dial.host} did not resolve: {exc.rcode}") from exc
    trace.dns = {"name": dial.host, "answer": ip}
    return replace(dial, addr=f"{ip}:{port}")


def _dial_failed(stage: str, dial: Dial, exc: BaseException, cause: str) -> CallbackFailed:
    return CallbackFailed(stage, http_dial_line(dial, exc, datetime.now(UTC)), cause=cause)


async def connection(
    worker: WorkerRuntime, route: Route, method: str, url: str, trace: Trace
) -> tuple[H11Stream, str]:
    """A kept-alive connection of this worker's along `route`, else a new one (DNS lookup, TLS handshake).
    Returns it with the virtual address it leads to; `trace.connections` says which it was."""
    dial = leg_dial(worker, route, method, url)
    idle = worker.pool.take(route.key)
    if idle is None:
        trace.connections.append("new")
        dial = await resolve(worker, dial, route.port, trace)
        tls = worker.client_context() if route.tls else None
        return await _dial(worker, dial, tls), dial.addr.rpartition(":")[0]
    trace.connections.append("reused")
    # Go looks nothing up for a kept-alive connection: the answer it was dialed with is this callback's
    # (`connections` says it was reused), as a joined QUIC dial's is in grpc_callback.
    trace.dns = trace.dns or {"name": route.host, "answer": idle.ip}
    try:
        await worker.ctx.cross_link(idle.ip)  # a faulty link delays or loses each request, not just dials
    except TimeoutError as exc:
        idle.stream.close()  # worker-utils gives the request up, and Go closes the connection it was on
        raise CallbackFailed(
            method.lower(), leg_broken_line(method, url, "timeout"), cause=f"{method}: {exc}"
        ) from exc
    return idle.stream, idle.ip


async def _dial(worker: WorkerRuntime, dial: Dial, tls: ssl.SSLContext | None) -> H11Stream:
    ip, _, port = dial.addr.rpartition(":")
    try:
        reader, writer = await worker.ctx.open_tcp(
            ip, int(port), tls=tls, server_hostname=dial.host if tls else None
        )
    except ssl.SSLCertVerificationError as exc:
        raise _dial_failed("tls", dial, exc, f"certificate verify failed: {exc.verify_message}") from exc
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        stage = "tls" if isinstance(exc, ssl.SSLError) else "connect"
        raise _dial_failed(stage, dial, exc, f"dial {dial.addr} ({dial.host}): {_said(exc)}") from exc
    return H11Stream(h11.CLIENT, reader, writer)


def _said(exc: BaseException) -> str:
    """ncpsim's own account of a dial error for the events: the network map's words, never a loopback port."""
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    if isinstance(exc, (TimeoutError, Unreachable, Refused)):
        return str(exc) or "timed out"
    return "connection refused" if isinstance(exc, ConnectionRefusedError) else type(exc).__name__


async def _connect_tunnel(
    worker: WorkerRuntime, stream: H11Stream, pod_host: str, dial: Dial, trace: Trace
) -> H11Stream:
    """Legacy worker-utils: CONNECT to the pod's 8443, then TLS to the pod inside the tunnel."""
    authority = f"{pod_host}:{INVOCATION_TLS_PORT}"
    # No X-Request-Id: worker-utils sends none, so the proxy's log line carries the proxy's own id.
    headers = [("host", authority), ("user-agent", f"worker-utils/{worker.spec.worker_utils}")]
    await stream.send(h11.Request(method="CONNECT", target=authority, headers=headers))
    event = await stream.next_event(GET_HEADERS_TIMEOUT)
    status = getattr(event, "status_code", 0)
    trace.statuses.append(status)
    if status != 200:
        line = connect_status_line(dial.method, dial.url, status)
        raise CallbackFailed("connect", line, status, cause=f"CONNECT {authority} answered {status}")
    inner = TunnelTls(stream.reader, stream.writer, worker.client_context(), pod_host)
    pod = replace(dial, host=pod_host, proxied=False)  # the worker's own TLS to the pod, not to the proxy
    try:
        await inner.handshake(GET_HEADERS_TIMEOUT)
    except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
        cause = f"TLS handshake with the pod failed: {_said(exc)}"
        failure = exc if isinstance(exc, ssl.SSLError) else ssl.SSLEOFError()
        raise _dial_failed("tls", pod, failure, cause) from exc
    return H11Stream(h11.CLIENT, inner, inner)  # type: ignore[arg-type]  # stream-shaped, see TunnelTls


async def callback(worker: WorkerRuntime, work: dict[str, Any], trace: Trace) -> None:
    """GET the client's request, run the function, POST its response: each leg on a connection from the
    worker's pool (worker-utils 1.3.2+), or both inside one CONNECT tunnel of their own (older ones)."""
    if worker.proxy_ca_broken:
        raise CallbackFailed("tls", NO_PROXY_CA, cause="NVCF_PROXY_CA_PEM holds no certificate")
    if worker.sends_connect:
        await _tunneled_callback(worker, work, trace)
        return
    route = route_of(work)
    # Absolute-form only as a forward-proxy request; straight to the pod the request line carries the path.
    url = work["targetURI"].rstrip("/") + ATTACH_PATH
    line = url if work.get("proxyURI") else ATTACH_PATH
    got = await _pooled_leg(worker, route, "GET", (url, line), _get_headers(worker, work), b"", trace)
    answer = echo_function(got.body)
    await _pooled_leg(worker, route, "POST", (url, line), _post_headers(worker, work), answer, trace)


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
    urls: tuple[str, str],
    headers: list[tuple[str, str]],
    body: bytes,
    trace: Trace,
) -> Response:
    """One leg on a pooled connection, which goes back to the pool once its exchange is complete. A GET that
    a kept-alive connection lost before any byte of an answer is sent again on another one, as Go's
    Transport retries an idempotent request (the server closed an idle connection as it was reused).
    `urls`: the request's URL (what Go's errors name) and the request line's target."""
    url, target = urls
    while True:
        stream, ip = await connection(worker, route, method, url, trace)
        try:
            response = await _send(stream, method, (url, target), headers, body)
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
    proxy_url, pod_host = urlsplit(work["proxyURI"]), urlsplit(work["targetURI"]).hostname or ""
    url = f"https://{pod_host}:{INVOCATION_TLS_PORT}{ATTACH_PATH}"  # its own TLS to the pod: an https target
    dial = Dial(proxy_url.hostname or "", worker.dns_address, method="GET", url=url, proxied=True)
    trace.connections.append("new")
    dial = await resolve(worker, dial, proxy_url.port or 443, trace)
    outer = await _dial(worker, dial, worker.client_context())
    try:
        stream = await _connect_tunnel(worker, outer, pod_host, dial, trace)
        get = await _send(stream, "GET", (url, ATTACH_PATH), _get_headers(worker, work), b"")
        answer = echo_function(_answered(get, "GET", trace).body)
        post = await _send(stream, "POST", (url, ATTACH_PATH), _post_headers(worker, work), answer)
        _answered(post, "POST", trace)
    finally:
        outer.close()  # the worker's own TLS session inside the tunnel goes with it


async def _send(
    stream: H11Stream, method: str, urls: tuple[str, str], headers: list[tuple[str, str]], body: bytes
) -> Response:
    url, target = urls
    try:
        timeout = GET_HEADERS_TIMEOUT if method == "GET" else None
        return await exchange(stream, method, target, headers, body, timeout=timeout)
    except (PeerClosed, ConnectionError, h11.ProtocolError, TimeoutError) as exc:
        log.debug("%s %s failed: %s: %s", method, url, type(exc).__name__, exc)
        why, cause = leg_failure(exc, stream.reader.at_eof())
        raise CallbackFailed(method.lower(), leg_broken_line(method, url, why), cause=cause) from exc


def _answered(response: Response, method: str, trace: Trace) -> Response:
    trace.statuses.append(response.status)
    if response.status != 200:
        body = response.body[:1024].decode(errors="replace")
        raise CallbackFailed(
            method.lower(),
            leg_status_line(method, response.status, body),
            response.status,
            cause=f"{method} answered {response.status}",
        )
    return response


def leg_failure(exc: BaseException, closed: bool) -> tuple[str, str]:
    """Why a callback leg got no whole answer: net/http's case (sim.protocols.go_errors.leg_broken_line)
    and ncpsim's words (h11's own wording stays in the debug log). `closed`: the other side had closed
    the connection (h11 calls a cut-off body a protocol error)."""
    if isinstance(exc, TimeoutError):
        return "timeout", f"no response headers within {GET_HEADERS_TIMEOUT:g} s"
    if isinstance(exc, h11.LocalProtocolError):
        return "malformed", "the worker could not frame its request"
    if isinstance(exc, h11.RemoteProtocolError) and not closed:
        return "malformed", "malformed response"
    if isinstance(exc, ClosedBeforeResponse):
        return "closed", str(exc)
    return "cut", "connection closed mid-response"


async def handle_http_work(worker: WorkerRuntime, work: dict[str, Any]) -> None:
    trace = Trace(work["requestId"], worker.name)
    events = worker.ctx.events
    tokens = [token_fingerprint(f"Bearer {work.get(key)}") for key in ("requestToken", "responseToken")]
    events.emit(
        CALLBACK_START,
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
        result["cause"] = failure.cause
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a worker bug must show in the report, not kill the worker host
        result = {"ok": False, "stage": "worker", "error": f"ncpsim worker error: {type(exc).__name__}"}
        result.update(status=None, cause=str(exc))
    if not result["ok"]:
        log_failure(worker.name, trace.request_id, result["error"])
    events.emit(
        CALLBACK_RESULT,
        requestId=trace.request_id,
        worker=worker.name,
        callback="http",
        dns=trace.dns,
        statuses=trace.statuses,
        connections=trace.connections,
        elapsedMs=int((time.monotonic() - trace.started) * 1000),
        **result,
    )
