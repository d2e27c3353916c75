"""invocation-service stand-in: one pod's client API and worker API (request-attach).

A client's POST /v2/nvcf/pexec/functions/{id} becomes a pending request with two single-use tokens;
the work message goes into the function's JetStream stream with this pod's target and the proxy address; the worker GETs
the request and POSTs the response to this pod (and only this pod knows its tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid
from dataclasses import dataclass, field
from typing import NamedTuple

import h11

from certs.profiles import INVOCATION_SECRET
from dns.rule import dashed_ip
from sim.model.events import ATTACH_GET, ATTACH_POST, POD_REQUEST
from sim.model.parts import Pod
from sim.model.values import proxy_settings
from sim.nats.publisher import WorkPublisher
from sim.protocols.http1 import H11Stream, decode_headers, read_body, respond
from sim.protocols.pexec import (
    HEAD_BUFFER,
    Problem,
    function_id,
    head_refusal,
    head_size,
    poll_seconds,
    shown,
    unreadable_head,
)
from sim.protocols.request_attach import (
    H1_TYPE,
    INCOMPLETE,
    InnerResponse,
    TokenBook,
    parse_inner_response,
    request_h1,
    token_fingerprint,
)
from sim.protocols.tls import ReloadingContext, server_context
from sim.runtime.component import Context, Ready, connection_handler
from sim.runtime.log import component_log
from sim.wire import (
    ATTACH_PATH,
    INVOCATION_HTTP_PORT,
    INVOCATION_SUFFIX,
    INVOCATION_TLS_PORT,
    PEXEC_PREFIX,
    STATUS_PREFIX,
)

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "upgrade"}
log = component_log("ncpsim.invocation")


class Head(NamedTuple):
    """A request's head as the routes read it: header names lower case, values as h11 gives them."""

    method: str
    target: str
    headers: list[tuple[str, str]]


@dataclass
class Pending:
    request_id: str
    function: str
    request: bytes  # the client's request as an HTTP/1.1 message
    body: bytes
    response: asyncio.Future[InnerResponse] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    delivered: asyncio.Event = field(default_factory=asyncio.Event)  # the client has read the body


class InvocationPod:
    def __init__(self, ctx: Context, pod: Pod):
        self.ctx, self.pod = ctx, pod
        rng = random.Random(ctx.mint_seed)
        self.rng = rng
        self.tokens = TokenBook(rng)
        self.pending: dict[str, Pending] = {}
        self.settings = proxy_settings(ctx.values)
        self.work = WorkPublisher(ctx, "invocation-service")

    # Work handed to workers ------------------------------------------------------------------
    def work_message(self, pending: Pending) -> dict:
        port = INVOCATION_TLS_PORT if self.settings.upstream_tls else INVOCATION_HTTP_PORT
        if not self.settings.enabled:
            port = INVOCATION_HTTP_PORT  # no proxy: workers in this cluster call the pod's own port
        override = self.ctx.values.get("global", {}).get("workerEndpoints", {}).get("invocationServiceURL")
        target = override or f"http://{dashed_ip(self.pod.ip)}.{INVOCATION_SUFFIX}:{port}"
        return {
            "requestId": pending.request_id,
            "functionId": pending.function,
            "kind": "http",
            "targetURI": target,
            "proxyURI": self.settings.invocation_proxy_url if self.settings.enabled else "",
            "requestToken": self.tokens.mint(pending.request_id, "request"),
            "responseToken": self.tokens.mint(pending.request_id, "response"),
            "pod": self.pod.name,
        }

    async def publish(self, pending: Pending) -> None:
        work = self.work_message(pending)
        self.ctx.events.emit(
            "token.minted",
            requestId=pending.request_id,
            pod=self.pod.name,
            target=work["targetURI"],
            proxy=work["proxyURI"],
        )
        seq = await asyncio.wait_for(
            self.work.publish(pending.function, pending.request_id, work), self.work.deadline
        )
        self.ctx.events.emit("work.published", requestId=pending.request_id, pod=self.pod.name, seq=seq)

    # HTTP ------------------------------------------------------------------------------------
    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream = H11Stream(h11.SERVER, reader, writer, max_head=HEAD_BUFFER)
        port = writer.get_extra_info("sockname")[1]
        try:
            while True:
                if (plain := await stream.plain_request()) is not None:
                    request, body = plain
                    head = Head(request.method, request.target, list(request.headers))
                else:
                    try:
                        event = await stream.next_event()
                    except h11.RemoteProtocolError as exc:
                        await self.refuse_head(stream, unreadable_head(exc.error_status_hint), str(exc))
                        break
                    if not isinstance(event, h11.Request):
                        break
                    head = Head(
                        event.method.decode(), event.target.decode("latin-1"), decode_headers(event.headers)
                    )
                    body = None  # read once the head is routed, as it arrives
                size = head_size(head.method, head.target, head.headers)
                if status := head_refusal(size, head.target, len(head.headers)):
                    await self.refuse_head(stream, status, f"{size}-byte head, {len(head.headers)} fields")
                    break
                await self.route(stream, head, body, port)
                if not stream.reusable():
                    break
                stream.next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except Exception as exc:  # noqa: BLE001 - a bug must not kill the pod's listener: one line, 500
            log.error("%s: answering a client failed: %s: %s", self.pod.name, type(exc).__name__, exc)
            with contextlib.suppress(Exception):  # the response may have started: then only close
                await _problem(stream, 500, f"{type(exc).__name__}: {exc}")
        finally:
            writer.close()

    async def route(self, stream: H11Stream, req: Head, body: bytes | None, port: int) -> None:
        """Answer one request; `body`, when it came whole with a plain head, else read here."""
        path = req.target.split("?", 1)[0]
        headers = req.headers
        # Every request is recorded, routed or not: a probe's "no pod was contacted" rests on this.
        self.ctx.events.emit(
            POD_REQUEST,
            requestId=dict(headers).get("x-request-id"),
            pod=self.pod.name,
            method=req.method,
            path=path,
        )
        if body is None:
            body = await read_body(stream)
        method = req.method
        head = method == "HEAD"  # a HEAD answer has the GET's head and no body (RFC 9110 9.3.2)
        if path == ATTACH_PATH and method == "GET":
            await self.attach_get(stream, dict(headers))
        elif path == ATTACH_PATH and method == "POST":
            await self.attach_post(stream, dict(headers), body)
        elif path.startswith(PEXEC_PREFIX) and method == "POST":
            await self.invoke(stream, path[len(PEXEC_PREFIX) :], headers, body)
        elif path.startswith(STATUS_PREFIX) and method == "GET":
            await self.poll(stream, path, path[len(STATUS_PREFIX) :], dict(headers))
        else:
            await _problem(stream, 404, "Not Found", head)

    async def invoke(self, stream: H11Stream, rest: str, headers: list[tuple[str, str]], body: bytes) -> None:
        # Every check before the work is published: a refused call must leave no work for a worker to run.
        function, poll = function_id(rest, self.ctx.topology.functions), poll_seconds(dict(headers))
        if isinstance(function, Problem) or isinstance(poll, Problem):
            refusal = next(p for p in (function, poll) if isinstance(p, Problem))  # the function's first
            await self.refuse(stream, f"POST {PEXEC_PREFIX}{shown(rest)}", refusal)
            return
        request_id = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        inner = [(k, v) for k, v in headers if k not in HOP_BY_HOP and not k.startswith("nvcf-")]
        pending = Pending(request_id, function, request_h1("POST", "/", inner, body), body)
        self.pending[request_id] = pending
        self.ctx.events.emit("invoke.accepted", requestId=request_id, pod=self.pod.name, function=function)
        try:
            await self.publish(pending)
        except Exception as exc:  # noqa: BLE001 - the bus down, refused, slow: whatever nats-py raises
            # The API's 500 when its NATS publish fails for good (AppError::map_nats_err: Other); the last
            # cause is nats-py's words. A publish nats-py still holds for a reconnect may reach the stream
            # later: its worker then finds the request gone (404), as nobody is left to collect it.
            self.pending.pop(request_id, None)
            cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            detail = f"failed to send nats request; cause: Error publishing to nats; cause: {cause}"
            self.ctx.events.emit("invoke.unqueued", requestId=request_id, pod=self.pod.name, error=cause)
            await self.refuse(stream, f"POST {PEXEC_PREFIX}{function} ({request_id})", Problem(500, detail))
            return
        await self.answer_client(stream, pending, poll)

    async def poll(self, stream: H11Stream, path: str, request_id: str, headers: dict[str, str]) -> None:
        poll = poll_seconds(headers)
        pending = self.pending.get(request_id)
        if isinstance(poll, Problem):
            await self.refuse(stream, f"GET {shown(path)}", poll)
        elif pending is None:
            await _problem(stream, 404, f"Request {request_id} not found")
        else:
            await self.answer_client(stream, pending, poll)

    async def refuse_head(self, stream: H11Stream, status: int, why: str) -> None:
        """hyper's answer to a head past its limits or unreadable: the status, no body, the connection closed."""
        log.warning("%s: request head refused: %d %s", self.pod.name, status, why)
        self.ctx.events.emit("invoke.refused", pod=self.pod.name, request="head", status=status, reason=why)
        await respond(stream, status, close=True)

    async def refuse(self, stream: H11Stream, what: str, problem: Problem) -> None:
        """The API's refusal of a client's call, with one line in the pod's log and an event."""
        log.warning("%s: %s: %d %s", self.pod.name, what, problem.status, problem.detail)
        self.ctx.events.emit(
            "invoke.refused", pod=self.pod.name, request=what, status=problem.status, reason=problem.detail
        )
        if problem.plain:  # axum's own rejection of a path it cannot read
            await respond(stream, problem.status, problem.detail.encode(), [("content-type", "text/plain")])
        else:
            await _problem(stream, problem.status, problem.detail)

    async def answer_client(self, stream: H11Stream, pending: Pending, poll: int) -> None:
        try:
            inner = await asyncio.wait_for(asyncio.shield(pending.response), poll)
        except TimeoutError:
            await respond(
                stream, 202, b"", [("nvcf-reqid", pending.request_id), ("nvcf-status", "pending-evaluation")]
            )
            return
        out = [(k, v) for k, v in inner.headers if k not in HOP_BY_HOP]
        out += [("nvcf-reqid", pending.request_id), ("nvcf-status", "fulfilled")]
        await respond(stream, inner.status, inner.body, out)
        pending.delivered.set()
        self.pending.pop(pending.request_id, None)
        self.ctx.events.emit(
            "invoke.completed", requestId=pending.request_id, pod=self.pod.name, status=inner.status
        )

    async def attach_get(self, stream: H11Stream, headers: dict[str, str]) -> None:
        status, message, request_id = self.tokens.redeem(headers.get("authorization"), "request")
        pending = self.pending.get(request_id or "")
        if status == 200 and pending is None:
            status, message = 404, "Request is no longer pending"
        # xRequestId: the proxy's id for this request (workers send none), as its access log shows it; token:
        # which bearer the leg carried, so a leg refused here is still traced to the worker that sent it.
        self.ctx.events.emit(
            ATTACH_GET,
            requestId=request_id or headers.get("x-request-id"),
            pod=self.pod.name,
            status=status,
            reason=message,
            xRequestId=headers.get("x-request-id"),
            token=token_fingerprint(headers.get("authorization")),
        )
        if status != 200 or pending is None:
            await _problem(stream, status, message)
        elif H1_TYPE in headers.get("accept", ""):
            await respond(stream, 200, pending.request, [("content-type", H1_TYPE)])
        else:
            await respond(stream, 200, pending.body, [("content-type", "application/octet-stream")])

    async def attach_post(self, stream: H11Stream, headers: dict[str, str], body: bytes) -> None:
        status, message, request_id = self.tokens.redeem(headers.get("authorization"), "response")
        pending = self.pending.get(request_id or "")
        if status == 200 and pending is None:
            status, message = 404, "Request is no longer pending"
        inner = parse_inner_response(body) if status == 200 else message
        if isinstance(inner, str) and status == 200:
            status, message = 400, inner
        self.ctx.events.emit(
            ATTACH_POST,
            requestId=request_id or headers.get("x-request-id"),
            pod=self.pod.name,
            status=status,
            reason=message,
            xRequestId=headers.get("x-request-id"),
            token=token_fingerprint(headers.get("authorization")),
        )
        if status != 200 or pending is None or not isinstance(inner, InnerResponse):
            await _problem(stream, status, message or INCOMPLETE)
            return
        pending.response.set_result(inner)
        # The pod answers only once the client has read the body: the POST is long-lived.
        await pending.delivered.wait()
        await respond(stream, 200)


async def _problem(stream: H11Stream, status: int, detail: str, head: bool = False) -> None:
    """A problem+json reply (RFC 9457, as the problem_details crate writes it); to HEAD, the same head with its
    Content-Length and no body."""
    body = json.dumps({"status": status, "title": Problem(status, detail).title, "detail": detail}).encode()
    await respond(stream, status, body, [("content-type", "application/problem+json")], head=head)


async def run(ctx: Context, ready: Ready) -> None:
    pod = next(p for p in ctx.topology.pods if p.name == ctx.name)
    server = InvocationPod(ctx, pod)
    plain = await asyncio.start_server(connection_handler(server.serve), "127.0.0.1", 0)
    servers = [plain]
    bindings = {f"{pod.ip}:{INVOCATION_HTTP_PORT}/tcp": plain.sockets[0].getsockname()[1]}
    if server.settings.pod_worker_tls:
        tls = ReloadingContext(
            ctx.secret(INVOCATION_SECRET),
            server_context,
            lambda msg: ctx.events.emit("pod.tls.reload_failed", error=msg),
        )
        secure = await asyncio.start_server(
            connection_handler(server.serve), "127.0.0.1", 0, ssl=tls.sni_switcher()
        )
        servers.append(secure)
        bindings[f"{pod.ip}:{INVOCATION_TLS_PORT}/tcp"] = secure.sockets[0].getsockname()[1]
    ready(bindings)
    server.work.start()  # nats-py loads now, off the loop, before the first invocation
    try:
        await asyncio.Event().wait()
    finally:
        for srv in servers:
            srv.close()
        await server.work.close()
