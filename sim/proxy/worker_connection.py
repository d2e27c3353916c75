"""A worker's connection to the HTTP/1.1 front, its common case relayed in the protocol's callbacks.

The common case is a kept-alive worker's callback: a plain request (sim.protocols.h1plain) that the policy
forwards, its body whole in the bytes that brought its head, a parked connection to the pod with nothing
read past its last response, and a plain response that arrives whole. The connection relays it without a
task, a future or a timer handle per read (a proxy spent most of a callback's CPU on them), with the
functions the coroutine path uses for the bytes the pod and the worker get and for the access-log line.

Everything else goes to the coroutine path (HttpFront.serve), handed the request at the point the callbacks
reached, with the bytes read so far pending as that path keeps them: a head or a body still arriving, a
request h11 must judge, a pod to dial, a response that is not plain or not whole, the end of the pod's
stream, a timeout, a write that fails or must wait for the peer. A hand-over happens right after a read or
at a deadline, where the coroutine path's next read would start its own deadline, so each timeout keeps its
length; the end of either stream reaches the StreamReaders too (sim.proxy.upstream.PodProtocol), so what
that path reads next is what it would have read. The connection comes back to its callbacks between
requests once nothing is pending.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from sim.protocols.dial import DrainAware
from sim.protocols.h1plain import PlainRequest, head_end, plain_request, plain_response, request_bytes
from sim.protocols.reads import MAX_HEAD, STREAM_LIMIT, buffered
from sim.proxy import plain_relay
from sim.proxy.access_log import AccessRecord
from sim.proxy.downstream import REQUEST_START, ConnectionIdle, Downstream, end_reason, log
from sim.proxy.policy import Forward, RequestHead, decide
from sim.proxy.upstream import Upstream, upstream_fields

if TYPE_CHECKING:
    from sim.proxy.http_front import HttpFront

REQUEST, RESPONSE = "request", "response"  # what a connection in its callbacks waits for
RESPONSE_START = ord("H")  # "HTTP/1.1 ..."
# Pipelined bytes kept while a response is awaited, before the worker is read no further: a StreamReader's
# own limit (it pauses its transport past twice its limit).
MAX_PENDING = 2 * STREAM_LIMIT


class InFlight(NamedTuple):
    """The request a connection's callbacks relay: what the coroutine path needs to take it over."""

    plain: PlainRequest
    head: RequestHead
    fwd: Forward
    up: Upstream
    started: float  # monotonic, as plain_relay.exchange notes it


class WorkerConnection(DrainAware):
    """One worker's connection: in its callbacks (`waiting` says for what), or in its task (`task`), one at a
    time. The StreamReader and StreamWriter the coroutine path uses are the connection's own throughout."""

    def __init__(self, front: HttpFront):
        self.reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        super().__init__(self.reader)  # (which holds it weakly)
        self.front = front
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport
        self.down: Downstream
        self.peer: tuple[Any, ...] = ("?", 0)
        self.waiting: str | None = None  # REQUEST or RESPONSE in the callbacks; None in the task, or ended
        self.task: asyncio.Task[None] | None = None
        self.record = AccessRecord(start=0.0)
        self.flight: InFlight | None = None
        self.searched = 0  # how far the pod's response head was searched for its end
        self.timer: asyncio.TimerHandle | None = None
        self.deadline = 0.0
        self.reading_paused = False
        self.lost = False  # connection_lost came: writer.drain() would raise

    # The worker's side -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's are not asyncio.Transport subclasses)
        self.down = Downstream(
            self.reader, asyncio.StreamWriter(self.transport, self, self.reader, self.loop)
        )
        self.peer = transport.get_extra_info("peername") or ("?", 0)
        self.front.connections.add(self)
        self._await_request()

    def data_received(self, data: bytes) -> None:
        if self.waiting is None:
            super().data_received(data)
            return
        self.down.pending += data
        if self.waiting is REQUEST:
            self._next()
        elif len(self.down.pending) > MAX_PENDING and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        keep_open = super().eof_received()
        if self.waiting is not None:
            self.down.eof = True
            if self.waiting is REQUEST:  # (nothing is pending then: any byte was served or handed over)
                self.ended(None)
        return keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.lost = True
        if self.waiting is REQUEST:
            self.ended(exc)  # as the read waiting for the next request would have raised it
        # Awaiting a response, the worker's leaving is found where the coroutine path finds it: writing the
        # response to it (or answering the pod's silence).

    def _await_request(self) -> None:
        """Between requests: a new access-log record (its start is now, as the coroutine path begins one), and
        the connection idle timeout while nothing is pending."""
        self.record = AccessRecord(start=time.time(), forwarded_for="-")
        self.waiting = REQUEST
        self._resume_reading()
        if self.down.pending:
            self._next()
        elif self.down.eof:
            self.ended(None)
        else:
            self._arm(self.front.connection_idle_timeout)

    def _next(self) -> None:
        """The pending bytes' request, relayed here if it is the common case, else handed over."""
        front, down, record = self.front, self.down, self.record
        pending = down.pending
        if pending[0] not in REQUEST_START or (end := head_end(pending)) < 0:
            self._hand_over(front._one_request(down, record))  # h11's to judge, or a head still arriving
            return
        plain = plain_request(bytes(pending[:end]))
        if plain is None:
            self._hand_over(front._one_request(down, record))
            return
        head = RequestHead(plain.method, plain.target, "1.1", plain.headers, plain.content_lengths)
        fwd = decide(head, front.policy)
        if not isinstance(fwd, Forward) or len(pending) < end + plain.length:
            self._hand_over(front._one_request(down, record))  # a refusal, or a body still arriving
            return
        record.request_id = head.header("x-request-id") or str(uuid.uuid4())
        up = front.pool.checkout(fwd.authority)
        if up is None or not up.idle():  # a pod to dial, or a connection the coroutine path must read
            self._hand_over(front._forward_plain(down, plain, head, fwd, record, up))
            return
        self._send(plain, head, fwd, up)

    def _send(self, plain: PlainRequest, head: RequestHead, fwd: Forward, up: Upstream) -> None:
        """The request to the pod, as plain_relay.exchange sends it; then its response is awaited here."""
        front, down, record = self.front, self.down, self.record
        assert up.protocol is not None
        record.upstream_host = up.addr
        del down.pending[: plain.size]
        fields = upstream_fields(head, fwd, record.request_id)
        self.flight = flight = InFlight(plain, head, fwd, up, time.monotonic())
        body = down.take(plain.length)
        record.bytes_received += len(body)
        try:
            plain_relay.put(
                up.writer, request_bytes(plain.method, fwd.path, fields) + body, plain_relay.TO_POD
            )
        except ConnectionError as exc:
            self._hand_exchange(_raising(exc))
            return
        if up.protocol.write_paused or up.writer.transport.is_closing():  # drain() would wait, or fail
            self._hand_exchange(
                plain_relay.sent(down, up, plain, record, flight.started, front.stream_idle_timeout)
            )
            return
        self.waiting, self.searched = RESPONSE, 0
        up.protocol.sink = self
        self._arm(front.stream_idle_timeout)

    # The pod's side (PodSink) ----------------------------------------------------------------
    def pod_data(self, data: bytes) -> None:
        flight = self.flight
        assert flight is not None and self.waiting is RESPONSE
        up = flight.up
        pending = up.pending
        pending += data
        if pending[0] != RESPONSE_START:
            self._hand_response()  # h11 reads it from its first byte
            return
        if (end := head_end(pending, self.searched)) < 0:
            if len(pending) > MAX_HEAD:
                self._hand_response()
                return
            self.searched = len(pending)
            self._arm(self.front.stream_idle_timeout)  # as the next read would wait
            return
        plain = plain_response(bytes(pending[:end]))
        if plain is None or len(pending) < end + plain.length or not self._writable():
            self._hand_response()  # h11's to frame, a body still arriving, or a write that fails or waits
            return
        # The response is here whole: relayed as plain_relay.response relays it, ended as
        # HttpFront.plain_exchanged ends an exchange.
        assert up.protocol is not None
        up.protocol.sink = None
        self.waiting = None
        del pending[:end]
        record = self.record
        out = plain_relay.response_head(plain, flight.plain, record, flight.started)
        body = up.take(plain.length)
        record.bytes_sent += len(body)
        try:
            plain_relay.put(self.down.writer, out + body, plain_relay.TO_WORKER)
        except ConnectionError as exc:
            self._hand_exchange(_raising(exc))
            return
        up.reusable = plain.keep_alive and not up.pending
        if self.write_paused or self.transport.is_closing():  # drain() would wait, or fail
            self._hand_exchange(plain_relay.answered(self.down))
            return
        record.describe(flight.head)
        self.front.plain_logged(record, flight.fwd, up)
        self.flight = None
        if flight.plain.keep_alive:
            self._await_request()
        else:
            self.ended(None)

    def pod_ended(self) -> None:
        if self.waiting is RESPONSE:
            self._hand_response()  # the coroutine path reads the end after what is pending

    def _writable(self) -> bool:
        """The worker's connection takes a write at once: drain() would neither wait nor fail."""
        return not self.lost and not self.write_paused and not self.transport.is_closing()

    # Handing over and taking back -------------------------------------------------------------
    def _hand_response(self) -> None:
        flight = self.flight
        assert flight is not None
        self._hand_exchange(
            plain_relay.response(
                self.down,
                flight.up,
                flight.plain,
                self.record,
                flight.started,
                self.front.stream_idle_timeout,
            )
        )

    def _hand_exchange(self, exchange: Coroutine[Any, Any, bool]) -> None:
        """The exchange under way to the coroutine path, from `exchange` on."""
        flight, self.flight = self.flight, None
        assert flight is not None
        if flight.up.protocol is not None:
            flight.up.protocol.sink = None
        self._hand_over(
            self.front.plain_exchanged(
                self.down, flight.up, flight.plain, flight.head, flight.fwd, self.record, exchange
            )
        )

    def _hand_over(self, first: Coroutine[Any, Any, bool]) -> None:
        self.waiting = None
        self._resume_reading()
        self.task = self.loop.create_task(
            self.front.serve(self, first), name=f"proxy-http:{self.peer[0]}:{self.peer[1]}"
        )

    def take_back(self) -> bool:
        """Back to the callbacks, between requests, if nothing is pending or buffered, the stream has not
        ended and writes go out at once; else the coroutine path reads on."""
        down, reader = self.down, self.reader
        if down.pending or down.eof or buffered(reader) or reader.at_eof() or reader.exception() is not None:
            return False
        if not self._writable():
            return False
        down.reads.close()  # the coroutine path's read timer
        self.task = None
        self._await_request()
        return True

    def ended(self, exc: BaseException | None) -> None:
        """The connection is over (`exc`: why, if not closed between requests): closed, logged as the coroutine
        path logs its end."""
        self.waiting = None
        self._cancel_timer()
        self.front.connections.discard(self)
        self.down.close()
        (log.debug if exc is None else log.info)(
            "connection from %s:%s ended: %s", self.peer[0], self.peer[1], end_reason(exc)
        )

    def shut(self) -> None:
        """The front is shutting down: a connection in its callbacks closes (one in its task is cancelled)."""
        if self.waiting is not None:
            if self.flight is not None and self.flight.up.protocol is not None:
                self.flight.up.protocol.sink = None
            self.waiting = None
            self._cancel_timer()
            self.down.close()

    # Back-pressure and the deadline ----------------------------------------------------------
    def _resume_reading(self) -> None:
        if self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()

    def _arm(self, timeout: float) -> None:
        """The deadline of what the callbacks wait for, one timer a connection moved on only when it fires
        (sim.protocols.reads.TimedReads's way)."""
        self.deadline = self.loop.time() + timeout
        if self.timer is None or self.timer.when() > self.deadline:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.loop.call_at(self.deadline, self._fire)

    def _fire(self) -> None:
        self.timer = None
        if self.waiting is None:  # the task has the connection (with its own deadlines), or it ended
            return
        if self.loop.time() < self.deadline:
            self.timer = self.loop.call_at(self.deadline, self._fire)
        elif self.waiting is REQUEST:
            self.ended(ConnectionIdle(f"no request for {self.front.connection_idle_timeout:g} s"))
        else:  # no response from the pod within the stream idle timeout: the read would have raised it
            self._hand_exchange(_raising(TimeoutError()))

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


async def _raising(exc: BaseException) -> bool:
    """An exchange that failed in the callbacks, failing where the coroutine path takes it over."""
    raise exc
