"""One forwarded exchange of a plain request (sim.protocols.h1plain): its bytes relayed as they came, by length.

The worker's head is rewritten for the pod once and sent with the body bytes already here in one write; the
rest of the body follows as it arrives. A plain response from the pod (Content-Length framing) goes back
the same way: the rewritten head with the body bytes read with it, then the rest. A response that is not
plain is handed to h11 and relayed as sim.proxy.relay relays every response, so the worker sees what h11
would have framed. Failures are relay.py's, in the same words: what the front answers depends on nothing else.
"""

from __future__ import annotations

import asyncio
import time

import h11

from sim.protocols.h1plain import PlainRequest, PlainResponse, plain_response, response_bytes
from sim.proxy import relay
from sim.proxy.access_log import AccessRecord
from sim.proxy.downstream import Downstream, DownstreamClosed, reason
from sim.proxy.relay import BodyError, UpstreamClosed, response_fields
from sim.proxy.upstream import Upstream

CUT_SHORT = "peer closed connection without sending complete message body"  # h11's words, status 400


async def exchange(
    down: Downstream, up: Upstream, request: PlainRequest, head: bytes, record: AccessRecord, idle: float
) -> bool:
    """Relay `request` (its head already taken from `down`; `head`, the one the pod gets) and the response;
    True when the response went out whole. Raises as relay.exchange does."""
    started = time.monotonic()
    body = down.take(request.length)
    record.bytes_received += len(body)
    await _to_pod(up, head + body)
    answer = response(down, up, request, record, started, idle)
    if len(body) == request.length:  # a worker's GET or POST, usually: nothing more can arrive
        return await answer
    return await relay.alongside(_pump_body(down, up, request.length - len(body), record, idle), answer)


TO_POD = (UpstreamClosed, "upstream connection closed mid-request")
# A broken connection to the worker is the worker's leaving (DC), not the pod's.
TO_WORKER = (DownstreamClosed, "worker connection closed mid-response")
Broken = tuple[type[ConnectionError], str]


async def _to_pod(up: Upstream, data: bytes) -> None:
    put(up.writer, data, TO_POD)
    await _drain(up.writer, TO_POD)


async def _to_worker(down: Downstream, data: bytes) -> None:
    put(down.writer, data, TO_WORKER)
    await _drain(down.writer, TO_WORKER)


def put(writer: asyncio.StreamWriter, data: bytes, broken: Broken) -> None:
    """A write's first half (the second, drain, may wait): `broken`, the error a ConnectionError becomes."""
    try:
        writer.write(data)
    except ConnectionError as exc:
        raise broken[0](broken[1]) from exc


async def _drain(writer: asyncio.StreamWriter, broken: Broken) -> None:
    try:
        await writer.drain()
    except ConnectionError as exc:
        raise broken[0](broken[1]) from exc


async def sent(
    down: Downstream, up: Upstream, request: PlainRequest, record: AccessRecord, started: float, idle: float
) -> bool:
    """The rest of an exchange whose request (whole) was put to the pod in one write, not yet drained."""
    await _drain(up.writer, TO_POD)
    return await response(down, up, request, record, started, idle)


async def answered(down: Downstream) -> bool:
    """The rest of an exchange whose response (whole) was put to the worker in one write, not yet drained."""
    await _drain(down.writer, TO_WORKER)
    return True


async def _pump_body(down: Downstream, up: Upstream, left: int, record: AccessRecord, idle: float) -> None:
    """The rest of a Content-Length body, as it arrives; bytes past it are the worker's next request."""
    while left:
        try:
            data = await down.reads.read(idle)
        except ConnectionError as exc:
            raise DownstreamClosed("worker connection reset mid-request") from exc
        if not data:
            down.eof = True
            raise BodyError(h11.RemoteProtocolError(CUT_SHORT, 400))
        if len(data) > left:
            down.pending += data[left:]
            data = data[:left]
        left -= len(data)
        record.bytes_received += len(data)
        await _to_pod(up, data)


async def response(
    down: Downstream, up: Upstream, request: PlainRequest, record: AccessRecord, started: float, idle: float
) -> bool:
    """The pod's response to `request` (sent), read from what `up` has pending on, relayed to the worker."""
    end = await up.response_head(idle)
    plain = plain_response(bytes(up.pending[:end])) if end >= 0 else None
    if plain is None:  # h11 reads it from its first byte
        return await _judged(down, up, request, record, started, idle)
    del up.pending[:end]
    head = response_head(plain, request, record, started)
    body = up.take(plain.length)
    record.bytes_sent += len(body)
    await _to_worker(down, head + body)
    left = plain.length - len(body)
    while left:
        data = await up.reads.read(idle)
        if not data:
            up.eof = True
            raise UpstreamClosed("upstream connection closed mid-response")
        if len(data) > left:
            up.pending += data[left:]  # past the response: the connection is not reused
            data = data[:left]
        left -= len(data)
        record.bytes_sent += len(data)
        await _to_worker(down, data)
    up.reusable = plain.keep_alive and not up.pending
    return True


def response_head(plain: PlainResponse, request: PlainRequest, record: AccessRecord, started: float) -> bytes:
    """The head the worker gets for the pod's plain response to `request`; its status goes on record."""
    fields = response_fields(plain.headers, plain.status, record, started)
    if not request.keep_alive:
        fields.append(("Connection", "close"))  # as h11 adds it when the request asked to close
    return response_bytes(plain.status, reason(plain.status), fields)


async def _judged(
    down: Downstream, up: Upstream, request: PlainRequest, record: AccessRecord, started: float, idle: float
) -> bool:
    """A response that is not plain, framed by h11 on both sides as relay.exchange frames every response."""
    pod = up.h11(request.method)
    ok = await relay.pump_response(
        down.answering(request.method, request.keep_alive), pod, record, started, idle
    )
    up.settle(pod)
    return ok
