"""An HTTP callback load generator: pre-minted work, then the worker's GET + POST of request-attach.

Minting: the benchmark invokes the echo function on the pod's client API with NVCF-POLL-SECONDS 0 (the
pod answers 202 at once) and pulls the work messages the pod publishes from the function's JetStream
stream, as the only worker (signed in as an internal user, so no callout is involved). Each message carries the pod target and two single-use tokens, as a worker gets them.

A callback is then exactly what worker-utils does (sim.worker.http_callback): GET the request with the request
token, run the echo function, POST the response with the response token. The pod answers that POST only
once the client has read the body, so each callback also has a status poll in flight on a plain
keep-alive connection to the pod's client port; that cost is the same whichever way the callback goes.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import urlsplit

import h11
from nats.js.errors import ServiceUnavailableError

from bench.stacks import BenchStack
from sim.model.parts import Pod
from sim.nats.client import connect_once
from sim.nats.stack import REGION, StackKeys
from sim.nats.work import PULL_RETRY_FIRST, RECONNECT_WAIT
from sim.nats.workqueue import WorkPuller
from sim.protocols.dial import open_within
from sim.protocols.http1 import H11Stream, exchange
from sim.protocols.request_attach import H1_TYPE
from sim.protocols.tasks import cancelled
from sim.protocols.tls import client_context
from sim.wire import NATS_PORT
from sim.worker.http_callback import ATTACH_PATH, echo_function

FUNCTION = "http-echo"
PEXEC = f"/v2/nvcf/pexec/functions/{FUNCTION}"
STATUS = "/v2/nvcf/pexec/status/"
CALL_TIMEOUT = 30.0
USER_AGENT = "worker-utils/1.4.0 (ncpsim-bench)"


@dataclass(frozen=True)
class Route:
    """Where a callback's two requests go: a forward proxy (absolute-form target) or the pod itself."""

    name: str
    addr: tuple[str, int]
    sni: str
    absolute: bool


def worker_tls(bench: BenchStack) -> ssl.SSLContext:
    """The worker's trust: the public-style CA (its system roots) plus the stack CA (NVCF_PROXY_CA_PEM)."""
    public = bench.state_dir / "certs" / "ca" / "public" / "ca.crt"
    return client_context([public], bench.stack_ca.read_text())


def proxy_route(
    bench: BenchStack, work: dict[str, Any], addr: tuple[str, int] | None = None, name: str = "proxy"
) -> Route:
    """Through a front that terminates TLS for `invocation.<workerDomain>` (ncpsim's proxy unless `addr`)."""
    return Route(name, addr or bench.proxy_http(), urlsplit(work["proxyURI"]).hostname or "", True)


def direct_route(bench: BenchStack, pod: Pod) -> Route:
    """Straight to the pod's 8443, with the SNI and verification the proxy uses upstream (the pod name)."""
    return Route("direct", bench.pod_tls(pod), pod.fqdn, False)


async def open_stream(
    addr: tuple[str, int], tls: ssl.SSLContext | None = None, sni: str | None = None
) -> H11Stream:
    reader, writer = await open_within(*addr, CALL_TIMEOUT, tls, sni)
    return H11Stream(h11.CLIENT, reader, writer)


class Minter:
    """Holds a pull from the work stream and a client connection to one pod; `mint(n)` returns n work messages."""

    def __init__(self, bench: BenchStack, pod: Pod):
        self.bench, self.pod = bench, pod
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._nats: Any = None
        self._drain: asyncio.Task[None] | None = None
        self._client: H11Stream | None = None
        self.bodies: dict[str, bytes] = {}

    async def __aenter__(self) -> Self:
        host, port = self.bench.real(self.bench.topology.bus_lb_ip, NATS_PORT)
        seed = StackKeys.of(self.bench.stack.topology).internal["nvcf-api"]
        self._nats = await connect_once(
            f"nats://{host}:{port}", reconnect=False, nkeys_seed_str=seed, name="bench-minter"
        )
        puller = await WorkPuller(self._nats, REGION, FUNCTION).start()
        self._drain = asyncio.create_task(self._pump(puller), name="bench-work-pull")
        self._client = await open_stream(self.bench.pod_http(self.pod))
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self._drain:
                await cancelled(self._drain, ConnectionError)
        finally:  # a pump that failed still leaves no connection open
            if self._client:
                await self._client.aclose()
            if self._nats is not None:
                await self._nats.close()

    async def _pump(self, puller: WorkPuller) -> None:
        """Take every work message as it comes (acked at once: the bench does the callbacks itself). A
        JetStream still electing its consumer's leader answers a pull with 503 for a moment: pulled again
        soon, then less often, as a worker's pull loop does (sim/nats/work.py)."""
        wait = PULL_RETRY_FIRST
        while True:
            try:
                msg = await puller.fetch(CALL_TIMEOUT)
            except ServiceUnavailableError:
                await asyncio.sleep(wait)
                wait = min(wait * 2, RECONNECT_WAIT)
                continue
            wait = PULL_RETRY_FIRST
            if msg is not None:
                await msg.ack()
                await self.queue.put(json.loads(msg.data))

    async def mint(self, count: int) -> list[dict[str, Any]]:
        assert self._client is not None
        host = [("host", "invocation"), ("content-type", "application/json")]
        for i in range(count):
            body = json.dumps({"bench": i, "at": time.time()}).encode()
            response = await exchange(
                self._client, "POST", PEXEC, [*host, ("nvcf-poll-seconds", "0")], body, timeout=CALL_TIMEOUT
            )
            if response.status != 202:
                raise RuntimeError(f"minting work: the pod answered {response.status}, not 202")
            self.bodies[response.header("nvcf-reqid") or ""] = body
        return [await asyncio.wait_for(self.queue.get(), CALL_TIMEOUT) for _ in range(count)]


async def callback(
    stream: H11Stream, route: Route, work: dict[str, Any], poller: H11Stream, body: bytes
) -> bool:
    """One worker callback (GET, echo, POST) while a status poll waits for the client's answer."""
    url = work["targetURI"].rstrip("/") + ATTACH_PATH if route.absolute else ATTACH_PATH
    base = [
        ("host", urlsplit(work["targetURI"]).netloc),
        ("user-agent", USER_AGENT),
        ("x-request-id", work["requestId"]),
    ]
    poll = asyncio.create_task(
        exchange(
            poller,
            "GET",
            STATUS + work["requestId"],
            [("host", "invocation"), ("nvcf-poll-seconds", "30")],
            timeout=CALL_TIMEOUT,
        ),
        name="bench-status-poll",
    )
    try:
        got = await exchange(
            stream,
            "GET",
            url,
            [
                *base,
                ("authorization", f"Bearer {work['requestToken']}"),
                ("accept", f"{H1_TYPE}, application/octet-stream"),
            ],
            timeout=CALL_TIMEOUT,
        )
        if got.status != 200:
            return False
        posted = await exchange(
            stream,
            "POST",
            url,
            [*base, ("authorization", f"Bearer {work['responseToken']}"), ("content-type", H1_TYPE)],
            echo_function(got.body),
            timeout=CALL_TIMEOUT,
        )
        answer = await poll
    finally:
        await cancelled(poll, Exception)  # the poll's own end is not the callback's
    return posted.status == 200 and answer.status == 200 and answer.body == body


Connect = Callable[[], Awaitable[H11Stream]]


async def _lane(
    works: list[dict[str, Any]],
    route: Route,
    connect: Connect,
    reuse: bool,
    poll_addr: tuple[str, int],
    bodies: dict[str, bytes],
) -> int:
    """Callbacks one after another: on one kept-alive connection (`reuse`), else a new one each.

    A connection used once closes beside the next callback, as a client's does; the lane ends only once
    every close has (see close_within: the run's loop ends with the lane)."""
    poller = await open_stream(poll_addr)
    stream: H11Stream | None = None
    closing: set[asyncio.Task[None]] = set()
    ok = 0
    try:
        stream = await connect() if reuse else None
        for work in works:
            conn = stream or await connect()
            try:
                ok += await callback(conn, route, work, poller, bodies[work["requestId"]])
            except (ConnectionError, h11.ProtocolError, TimeoutError, ssl.SSLError):
                if reuse:
                    raise
            finally:
                if conn is not stream:
                    closing.add(task := asyncio.create_task(conn.aclose()))
                    task.add_done_callback(closing.discard)
    finally:
        await asyncio.gather(poller.aclose(), *([stream.aclose()] if stream else []), *closing)
    return ok


async def drive(
    works: list[dict[str, Any]],
    route: Route,
    tls: ssl.SSLContext,
    *,
    lanes: int,
    reuse: bool,
    poll_addr: tuple[str, int],
    bodies: dict[str, bytes],
) -> dict[str, Any]:
    """Run the callbacks over `lanes` concurrent lanes; callbacks per second over the whole batch."""

    async def connect() -> H11Stream:
        return await open_stream(route.addr, tls, route.sni)

    shares = [works[i::lanes] for i in range(lanes)]
    started = time.perf_counter()
    oks = await asyncio.gather(*(_lane(s, route, connect, reuse, poll_addr, bodies) for s in shares if s))
    seconds = time.perf_counter() - started
    return {
        "route": route.name,
        "calls": len(works),
        "ok": sum(oks),
        "lanes": lanes,
        "connection": "keep-alive" if reuse else "new TLS connection per callback",
        "seconds": round(seconds, 3),
        "per_second": round(len(works) / seconds, 1),
    }
