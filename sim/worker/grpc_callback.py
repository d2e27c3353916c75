"""A worker's gRPC callback, as worker-utils makes it (DESIGN.md section 2).

Resolve the connect URL's host in the worker's cluster, open QUIC to it (SNI = host, ALPN h3) trusting
the worker's system roots plus NVCF_PROXY_CA_PEM, `POST /v1/proxy` with the bearer token and request id,
and on 200 serve the echo service over HTTP/2 inside that stream until grpc-proxy ends it. Failures
are retried 5 times from 10 ms, except 401/403; every outcome is an event, never an exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dns.client import NameNotResolved
from sim.model.topology import WorkerSpec
from sim.protocols.grpc_callback import CallbackTarget, parse_connect_url, retry_delay
from sim.protocols.grpc_tunnel import GrpcError, H2Tunnel, echo_replies
from sim.protocols.h3 import (
    H3Endpoint,
    HandshakeFailed,
    StreamError,
    client_configuration,
    trust_pem,
)
from sim.runtime.component import Context
from sim.worker import log as worker_log
from sim.worker.quic_cache import IDLE_TIMEOUT, QuicCache

HANDSHAKE_TIMEOUT = 5.0
RESPONSE_TIMEOUT = 10.0  # for the callback's response headers
ERROR_BODY_LIMIT = 4096


class Worker(Protocol):
    """What a gRPC callback needs of sim.worker.host.WorkerRuntime."""

    spec: WorkerSpec
    ctx: Context
    proxy_ca_pem: str

    quic: QuicCache | None

    def cafiles(self) -> list[Path]: ...


@dataclass
class Outcome:
    status: int | None  # the callback's HTTP status; None when no HTTP answer came
    error: str | None = None
    stage: str = "done"  # where it stopped: dns, connect, tls, callback, tunnel, worker, done
    calls: int = 0  # gRPC calls served through the tunnel


async def handle_work(worker: Worker, work: dict[str, Any]) -> None:
    events, request_id = worker.ctx.events, work.get("requestId")
    direct = ".grpc-headless." in str(work.get("connectUrl", ""))  # proxy disabled: the pod's own name
    events.emit(
        "worker.callback.start",
        requestId=request_id,
        worker=worker.spec.name,
        callback="grpc",
        url=work.get("connectUrl"),
        pod=work.get("pod"),
        proxy="" if direct else work.get("connectUrl"),
    )
    attempts, outcome = 0, Outcome(None, "not attempted", "worker")
    dns: dict[str, Any] = {}  # the last answer the worker got, for the replay's trace
    connections: list[str] = []  # per attempt: "new" (dialed) or "reused" (the cached connection)
    try:
        target = parse_connect_url(work["connectUrl"])
        while True:
            attempts += 1
            outcome = await _attempt(worker, target, work, dns, connections)
            delay = retry_delay(attempts, outcome.status)
            if delay is None:
                break
            await asyncio.sleep(delay)  # worker-utils' backoff, not a test wait
    except (KeyError, ValueError) as exc:
        outcome = Outcome(None, f"bad work message: {exc}", "worker")
    except Exception as exc:  # noqa: BLE001 - one broken callback must not take the worker down
        outcome = Outcome(None, f"internal error: {exc!r}", "worker")
    events.emit(
        "worker.callback.result",
        requestId=request_id,
        worker=worker.spec.name,
        callback="grpc",
        dns=dns,
        connections=connections,
        ok=outcome.status == 200 and outcome.error is None,
        stage=outcome.stage,
        status=outcome.status,
        error=outcome.error,
        attempts=attempts,
        calls=outcome.calls,
    )
    worker_log.callback_failed(
        worker.spec.name,
        "grpc",
        {
            "ok": outcome.status == 200 and outcome.error is None,
            "requestId": request_id,
            "status": outcome.status,
            "error": outcome.error,
        },
    )


async def _attempt(
    worker: Worker, target: CallbackTarget, work: dict[str, Any], dns: dict[str, Any], connections: list[str]
) -> Outcome:
    """One POST /v1/proxy on the worker's connection to the connect URL's host, dialed if it has none."""
    host = f"{target.host}:{target.port}"

    async def dial() -> H3Endpoint:
        ip = await _resolve(worker, target.host, work.get("requestId"), dns)
        config = client_configuration(
            target.host, trust_pem(worker.cafiles(), worker.proxy_ca_pem), idle_timeout=IDLE_TIMEOUT
        )
        return await worker.ctx.open_quic(ip, target.port, config, timeout=HANDSHAKE_TIMEOUT)

    cache = worker.quic = worker.quic or QuicCache()
    try:
        endpoint, reused = await cache.get(host, dial)
    except NameNotResolved as exc:
        return Outcome(None, f"DNS lookup of {target.host} failed: {exc.rcode}", "dns")
    except HandshakeFailed as exc:
        return Outcome(None, handshake_error(exc), "tls")
    except OSError as exc:  # sim.model.netmap's Unreachable / Refused
        return Outcome(None, f"connect to {target.host}:{target.port} failed: {exc}", "connect")
    connections.append("reused" if reused else "new")
    outcome = await _post(worker, endpoint, target, work)
    if reused and endpoint.closed and outcome.status is None:
        # The cached connection died under the request: h3.go sends it again on a fresh connection.
        cache.forget(host)
        return await _attempt(worker, target, work, dns, connections)
    return outcome


def handshake_error(exc: HandshakeFailed) -> str:
    if exc.certificate_rejected:
        return f"TLS handshake failed: certificate verify failed: {exc.reason}"
    return f"TLS handshake failed: {exc.reason}"


async def _resolve(worker: Worker, name: str, request_id: str | None, dns: dict[str, Any]) -> str:
    try:
        answer = await worker.ctx.resolve(name)
    except NameNotResolved as exc:
        dns.update(name=name, rcode=exc.rcode)
        worker.ctx.events.emit(
            "worker.dns", requestId=request_id, worker=worker.spec.name, name=name, rcode=exc.rcode
        )
        raise
    worker.ctx.events.emit(
        "worker.dns", requestId=request_id, worker=worker.spec.name, name=name, answer=answer
    )
    dns.clear()
    dns.update(name=name, answer=answer[0])
    return answer[0]


def callback_headers(
    target: CallbackTarget, work: dict[str, Any], worker_utils: str
) -> list[tuple[bytes, bytes]]:
    authority = target.host if target.port == 443 else f"{target.host}:{target.port}"
    headers = [
        (":method", "POST"),
        (":scheme", "https"),
        (":authority", authority),
        (":path", target.path),
        ("authorization", f"Bearer {work['token']}"),
        ("x-request-id", str(work["requestId"])),
        ("user-agent", f"worker-utils/{worker_utils}"),
    ]
    return [(k.encode(), v.encode()) for k, v in headers]


async def _post(
    worker: Worker, endpoint: H3Endpoint, target: CallbackTarget, work: dict[str, Any]
) -> Outcome:
    stream = endpoint.open_request(callback_headers(target, work, worker.spec.worker_utils))
    try:
        async with asyncio.timeout(RESPONSE_TIMEOUT):
            await stream.headers
    except (TimeoutError, StreamError) as exc:
        stream.reset()
        return Outcome(None, f"no response to POST {target.path}: {exc or 'timed out'}", "callback")
    if stream.status != 200:
        body = await _read_some(stream)
        stream.end()
        return Outcome(
            stream.status, f"HTTP {stream.status}: {body.decode(errors='replace').strip()}", "callback"
        )
    tunnel = H2Tunnel(stream, client_side=False)
    try:
        await tunnel.serve(_echo)
    except (GrpcError, StreamError) as exc:
        return Outcome(200, f"tunnel failed: {exc}", "tunnel", tunnel.calls)
    finally:
        stream.end()
    return Outcome(200, None, "done", tunnel.calls)


async def _read_some(stream: Any) -> bytes:
    body = b""
    try:
        while len(body) < ERROR_BODY_LIMIT and (chunk := await stream.read()):
            body += chunk
    except StreamError:
        pass
    return body[:ERROR_BODY_LIMIT]


async def _echo(path: str, request: bytes) -> AsyncIterator[bytes]:
    for reply in echo_replies(path, request):
        yield reply
