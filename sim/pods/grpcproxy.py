"""A grpc-proxy pod: client-facing gRPC over h2c (TCP 10081) and worker callbacks over HTTP/3 (UDP 10084).

For each client call the pod mints a single-use token, publishes work for a worker on NATS and waits
for the worker's `POST /v1/proxy`. Accepted, that request stream becomes the tunnel in which the pod is
the HTTP/2 client (sim.protocols.grpc_tunnel) and relays the client's call to the worker and the answers back.
Every decision (token, request check, URL) comes from sim.protocols.grpc_callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable

import grpc
from aioquic.quic.connection import QuicConnection

from certs.profiles import GRPC_SECRET
from sim.model.events import GRPC_ACCEPTED, GRPC_REJECTED, TOKEN_MINTED
from sim.model.parts import Pod
from sim.nats.publisher import WorkPublisher
from sim.protocols.grpc_callback import (
    INVALID_AUTH,
    TOKEN_TTL,
    Accept,
    Reject,
    TokenBook,
    check_callback,
    connect_url,
    new_request_id,
    work_message,
)
from sim.protocols.grpc_tunnel import INTERNAL, STREAM, UNARY, UNAVAILABLE, GrpcError, H2Tunnel
from sim.protocols.h3 import H3Endpoint, H3Server, H3Stream, ReloadingServerConfig
from sim.protocols.tasks import Tasks
from sim.runtime.component import Context, Ready
from sim.wire import GRPC_CALL_TAG, GRPC_CALLBACK_PORT, GRPC_CLIENT_PORT

SERVICE = "ncpsim.Echo"
QUEUE = "grpc-echo"
CALLBACK_TIMEOUT = TOKEN_TTL  # a worker that has not called back while its token lives never will


def _status_code(status: int) -> grpc.StatusCode:
    return next((code for code in grpc.StatusCode if code.value[0] == status), grpc.StatusCode.UNKNOWN)


def _text_headers(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}


def respond_text(stream: H3Stream, status: int, message: str) -> None:
    """A complete plain-text answer, as Go's http.Error writes it (message and a newline)."""
    body = (message + "\n").encode()
    stream.send_headers(
        [
            (b":status", str(status).encode()),
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
    )
    stream.write(body, end=True)


class GrpcProxyPod:
    def __init__(self, ctx: Context, pod: Pod, clock: Callable[[], float] = time.monotonic):
        self.ctx, self.pod, self.clock = ctx, pod, clock
        self.rng = random.Random(ctx.mint_seed)  # replays mint the same tokens
        self.book = TokenBook(self.rng)
        self.url = connect_url(pod.ip, ctx.topology.worker_domain, ctx.topology.proxy_enabled)
        self.waiting: dict[str, asyncio.Future[H3Stream]] = {}
        self.tasks = Tasks()
        self.grpc: grpc.aio.Server | None = None
        self.h3: H3Server | None = None
        self.work = WorkPublisher(ctx, "grpc-proxy")

    # Lifecycle -------------------------------------------------------------------------------
    async def start(self) -> dict[str, int]:
        self.grpc = grpc.aio.server()
        self.grpc.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE,
                    {
                        "Unary": grpc.unary_unary_rpc_method_handler(self._unary),
                        "Stream": grpc.unary_stream_rpc_method_handler(self._stream),
                    },
                ),
            )
        )
        grpc_port = self.grpc.add_insecure_port("127.0.0.1:0")
        await self.grpc.start()
        config = ReloadingServerConfig(self.ctx.secret(GRPC_SECRET), self._tls_error)
        self.h3 = H3Server(config, self._endpoint)
        quic_port = await self.h3.start()
        return {
            f"{self.pod.ip}:{GRPC_CALLBACK_PORT}/udp": quic_port,
            f"{self.pod.ip}:{GRPC_CLIENT_PORT}/tcp": grpc_port,
        }

    async def close(self) -> None:
        if self.grpc is not None:
            await self.grpc.stop(grace=None)
        await self.tasks.cancel_all()
        if self.h3 is not None:
            self.h3.close()
        await self.work.close()

    def _tls_error(self, message: str) -> None:
        self.ctx.events.emit("grpc.tls.reload_failed", pod=self.pod.name, error=message)

    # Callback listener -----------------------------------------------------------------------
    def _endpoint(self, quic: QuicConnection) -> H3Endpoint:
        def on_request(stream: H3Stream) -> None:
            self.tasks.spawn(self._callback(stream), f"{self.pod.name}:callback-{stream.stream_id}")

        return H3Endpoint(quic, on_request=on_request)

    async def _callback(self, stream: H3Stream) -> None:
        headers = _text_headers(await stream.headers)
        verdict = check_callback(headers.get(":method", ""), headers.get(":path", ""), headers)
        if isinstance(verdict, Accept):
            waiter = self.waiting.get(verdict.request_id)
            spent = self.book.redeem(verdict.token, verdict.request_id, self.clock())
            if not spent or waiter is None or waiter.done():
                verdict = Reject(403, INVALID_AUTH)
        if isinstance(verdict, Reject):
            self.ctx.events.emit(
                GRPC_REJECTED,
                pod=self.pod.name,
                status=verdict.status,
                reason=verdict.message,
                requestId=headers.get("x-request-id"),
            )
            respond_text(stream, verdict.status, verdict.message)
            return
        self.ctx.events.emit(GRPC_ACCEPTED, requestId=verdict.request_id, pod=self.pod.name)
        stream.send_headers([(b":status", b"200")])
        assert waiter is not None  # an Accept that stayed one has its call waiting
        waiter.set_result(stream)  # the waiting call now owns the stream

    # Client-facing service -------------------------------------------------------------------
    async def _unary(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        replies = [message async for message in self._relay(UNARY, request, context)]
        if len(replies) != 1:
            await context.abort(
                _status_code(INTERNAL), f"worker sent {len(replies)} messages for a unary call"
            )
        return replies[0]

    async def _stream(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for message in self._relay(STREAM, request, context):
            yield message

    async def _relay(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        request_id = new_request_id(self.rng)
        token = self.book.mint(request_id, self.clock())
        tag = dict(context.invocation_metadata() or ()).get(GRPC_CALL_TAG)
        self.ctx.events.emit(TOKEN_MINTED, requestId=request_id, pod=self.pod.name, call=tag)
        # Like NVCF-REQID on HTTP invocations: lets a client (and ncpsim's replay) name the request at once.
        await context.send_initial_metadata((("nvcf-reqid", request_id),))
        waiter: asyncio.Future[H3Stream] = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = waiter
        messages, ok, error = 0, False, None
        try:
            await self._publish(request_id, work_message(request_id, token, self.url, self.pod.name))
            tunnel = await self._tunnel(request_id, waiter)
            try:
                async for message in tunnel.call(method, request):
                    messages += 1
                    yield message
                ok = True
            finally:
                with contextlib.suppress(ConnectionError):
                    await tunnel.close()
        except GrpcError as exc:
            error = exc.details
            await context.abort(_status_code(exc.status), exc.details)
        except ConnectionError as exc:  # the tunnel's stream or connection died under the call
            error = f"callback tunnel failed: {exc}"
            await context.abort(_status_code(UNAVAILABLE), error)
        finally:
            self.waiting.pop(request_id, None)
            self.book.revoke(token)  # a late callback for an abandoned call gets 403
            if not ok and waiter.done() and not waiter.cancelled():
                waiter.result().reset()  # a failed or abandoned call leaves no half-open tunnel
            self.ctx.events.emit(
                "grpc.call.done",
                requestId=request_id,
                pod=self.pod.name,
                method=method,
                messages=messages,
                ok=ok,
                error=error,
            )

    async def _tunnel(self, request_id: str, waiter: asyncio.Future[H3Stream]) -> H2Tunnel:
        try:
            async with asyncio.timeout(CALLBACK_TIMEOUT):
                stream = await asyncio.shield(waiter)  # a cancelled call must not cancel the future
        except TimeoutError:
            raise GrpcError(UNAVAILABLE, f"no worker called back within {CALLBACK_TIMEOUT:.0f}s") from None
        tunnel = H2Tunnel(stream, client_side=True)
        # The reader ends by itself when the worker ends its side after our GOAWAY.
        self.tasks.spawn(self._read_tunnel(tunnel), f"{self.pod.name}:tunnel-{request_id}")
        return tunnel

    @staticmethod
    async def _read_tunnel(tunnel: H2Tunnel) -> None:
        with contextlib.suppress(GrpcError, ConnectionError):
            await tunnel.run()

    async def _publish(self, request_id: str, work: dict[str, str]) -> None:
        """Into the function version's stream, on rq.<region>.<fvid>.<reqId> (the gRPC work subject)."""
        try:
            await asyncio.wait_for(self.work.publish(QUEUE, request_id, work), self.work.deadline)
        except Exception as exc:  # refused, unreachable, no stream, timed out: the call is UNAVAILABLE
            raise GrpcError(UNAVAILABLE, f"NATS unreachable: {type(exc).__name__}: {exc}") from exc


async def run(ctx: Context, ready: Ready) -> None:
    pod = next(p for p in ctx.topology.pods if p.name == ctx.name)
    service = GrpcProxyPod(ctx, pod)
    try:
        ready(await service.start())
        service.work.start()  # nats-py loads now, off the loop, before the first call
        await asyncio.Event().wait()  # until cancelled
    finally:
        await service.close()
