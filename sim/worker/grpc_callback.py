"""A worker's gRPC callback, as worker-utils makes it (DESIGN.md section 2).

Resolve the connect URL's host in the worker's cluster, open QUIC to it (SNI = host, ALPN h3) trusting
the worker's system roots plus NVCF_PROXY_CA_PEM, `POST /v1/proxy` with the bearer token and request id,
and on 200 serve the echo service over HTTP/2 inside that stream until grpc-proxy ends it. Failures
are retried 5 times from 10 ms, except 401/403; every outcome is an event, never an exception.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from dns.client import NameNotResolved
from sim.model.events import CALLBACK_RESULT, CALLBACK_START
from sim.model.parts import WorkerSpec
from sim.protocols.go_errors import CANCELED, NO_PROXY_CA, Dial, Leaf, quic_dial_line, quic_status_line
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
from sim.runtime.quic_dial import open_quic
from sim.worker.quic_cache import IDLE_TIMEOUT, QuicCache
from sim.worker.runtime import log_failure

HANDSHAKE_TIMEOUT = 5.0
RESPONSE_TIMEOUT = 10.0  # for the callback's response headers
ERROR_BODY_LIMIT = 4096


class Worker(Protocol):
    """What a gRPC callback needs of sim.worker.runtime.WorkerRuntime."""

    spec: WorkerSpec
    ctx: Context

    @property
    def proxy_ca(self) -> str: ...  # the certificates of NVCF_PROXY_CA_PEM
    @property
    def proxy_ca_broken(self) -> bool: ...  # NVCF_PROXY_CA_PEM set, without a certificate
    @property
    def dns_address(self) -> str: ...  # the cluster DNS Service, ip:53

    quic: QuicCache | None

    def cafiles(self) -> list[Path]: ...


@dataclass
class Outcome:
    status: int | None  # the callback's HTTP status; None when no HTTP answer came
    error: str | None = None  # what the Go worker library logs (sim.protocols.go_errors)
    stage: str = "done"  # where it stopped: dns, connect, tls, callback, tunnel, worker, done
    calls: int = 0  # gRPC calls served through the tunnel
    cause: str | None = None  # ncpsim's own account, beside the Go line in the events


# What each connection's dial looked up, for the callbacks that share it (they looked nothing up themselves,
# but their trace shows the answer their connection came from).
_ANSWERS: weakref.WeakKeyDictionary[H3Endpoint, dict[str, Any]] = weakref.WeakKeyDictionary()


async def handle_work(worker: Worker, work: dict[str, Any]) -> None:
    events, request_id = worker.ctx.events, work.get("requestId")
    direct = ".grpc-headless." in str(work.get("connectUrl", ""))  # proxy disabled: the pod's own name
    events.emit(
        CALLBACK_START,
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
        if worker.proxy_ca_broken:  # ca.ProxyCAs failed: the worker library cannot make its QUIC client
            raise _NoProxyCa
        while True:
            attempts += 1
            outcome = await _attempt(worker, target, work, dns, connections)
            delay = retry_delay(attempts, outcome.status)
            if delay is None:
                break
            await asyncio.sleep(delay)  # worker-utils' backoff, not a test wait
    except _NoProxyCa:
        # worker-utils logs this as fatal when it builds its QUIC client, and the worker exits; ncpsim keeps
        # the pod and fails each gRPC callback with the same line (the cause says so).
        cause = "NVCF_PROXY_CA_PEM holds no certificate: worker-utils exits at start-up (not modelled)"
        outcome = Outcome(None, NO_PROXY_CA, "worker", cause=cause)
    except (KeyError, ValueError) as exc:
        outcome = Outcome(None, f"bad work message: {exc}", "worker")
    except Exception as exc:  # noqa: BLE001 - one broken callback must not take the worker down
        outcome = Outcome(None, f"ncpsim worker error: {type(exc).__name__}", "worker", cause=str(exc))
    if not (outcome.status == 200 and outcome.error is None):
        log_failure(worker.spec.name, str(request_id), outcome.error or "", stateful=True)
    events.emit(
        CALLBACK_RESULT,
        requestId=request_id,
        worker=worker.spec.name,
        callback="grpc",
        dns=dns,
        connections=connections,
        ok=outcome.status == 200 and outcome.error is None,
        stage=outcome.stage,
        status=outcome.status,
        error=outcome.error,
        cause=outcome.cause,
        attempts=attempts,
        calls=outcome.calls,
    )


class _NoProxyCa(Exception):
    """NVCF_PROXY_CA_PEM is set and holds no certificate."""


async def _attempt(
    worker: Worker, target: CallbackTarget, work: dict[str, Any], dns: dict[str, Any], connections: list[str]
) -> Outcome:
    """One POST /v1/proxy on the worker's connection to the connect URL's host, dialed if it has none."""
    host = f"{target.host}:{target.port}"

    async def dial() -> H3Endpoint:
        ip = await _resolve(worker, target.host, work.get("requestId"), dns)
        config = client_configuration(
            target.host, trust_pem(worker.cafiles(), worker.proxy_ca), idle_timeout=IDLE_TIMEOUT
        )
        endpoint = await open_quic(worker.ctx, ip, target.port, config, timeout=HANDSHAKE_TIMEOUT)
        _ANSWERS[endpoint] = dict(dns)
        return endpoint

    cache = worker.quic = worker.quic or QuicCache()
    try:
        endpoint, reused = await cache.get(host, dial)
    except (NameNotResolved, HandshakeFailed, OSError) as exc:
        return dial_failed(worker, target, exc, dns)
    if not reused and not dns:  # it joined a dial another callback made: that dial's answer is its own
        dns.update(_ANSWERS.get(endpoint, {}))
    connections.append("reused" if reused else "new")
    outcome = await _post(worker, endpoint, target, work)
    if reused and endpoint.closed and outcome.status is None:
        # The cached connection died under the request: h3.go sends it again on a fresh connection.
        cache.forget(host)
        return await _attempt(worker, target, work, dns, connections)
    return outcome


def dial_failed(worker: Worker, target: CallbackTarget, exc: BaseException, dns: dict[str, Any]) -> Outcome:
    """The Go line and ncpsim's cause for a QUIC dial that failed (a shared dial's failure included: every
    callback waiting on it reports the same lookup)."""
    dial = Dial(target.host, worker.dns_address, quic=True)
    now = datetime.now(UTC)
    if isinstance(exc, NameNotResolved):
        dns.clear()
        dns.update(name=exc.name, rcode=exc.rcode)
        return Outcome(None, quic_dial_line(dial, exc, now), "dns", cause=str(exc))
    if isinstance(exc, HandshakeFailed):
        rejected = exc.certificate_rejected
        leaf = Leaf.of(exc.peer_certificate) if rejected and exc.peer_certificate is not None else None
        line = quic_dial_line(dial, exc, now, leaf=leaf, alert=None if rejected else exc.alert)
        return Outcome(None, line, "tls" if rejected or exc.alert else "connect", cause=handshake_error(exc))
    # sim.model.netmap's Unreachable / Refused: nothing answers the Initial, and quic-go waits out its
    # handshake idle timeout (ncpsim fails at once).
    cause = f"connect to {target.host}:{target.port} failed: {exc}"
    return Outcome(None, quic_dial_line(dial, exc, now), "connect", cause=cause)


def handshake_error(exc: HandshakeFailed) -> str:
    """ncpsim's account of a failed QUIC handshake: aioquic's reason, its patterns unwrapped (service_identity
    writes `DNSPattern(pattern=b'*.x')`, a Python repr no user should read)."""
    reason = PATTERN_REPR.sub(r"'\1'", exc.reason)
    if exc.certificate_rejected:
        return f"TLS handshake failed: certificate verify failed: {reason}"
    return f"TLS handshake failed: {reason}"


PATTERN_REPR = re.compile(r"\w+Pattern\(pattern=b'([^']*)'\)")


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
        cause = f"no response to POST {target.path}: {exc or 'timed out'}"
        # worker-utils cancels the request it got no answer to; a stream the proxy reset is not yet in
        # quic-go's words (ncpsim's are kept)
        return Outcome(None, CANCELED if isinstance(exc, TimeoutError) else cause, "callback", cause=cause)
    if stream.status != 200:
        body = (await _read_some(stream)).decode(errors="replace")
        stream.end()
        cause = f"HTTP {stream.status}: {body.strip()}"
        return Outcome(stream.status, quic_status_line(stream.status, body), "callback", cause=cause)
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
