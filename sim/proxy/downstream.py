"""The proxy's side of a worker's connection: reading request heads and writing local replies, as Envoy's
HTTP/1 codec and connection manager do them. Bytes only; what to answer comes from sim.proxy.policy.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time

import h11

from sim.protocols.http1 import H11Stream, reason_phrase
from sim.protocols.reads import MAX_HEAD, HeadReader
from sim.proxy.policy import Reject, http_date, with_host_from_url
from sim.runtime.log import component_log

# One line per connection that ended badly (INFO), the library's own detail only with NCPSIM_DEBUG set.
log = component_log("ncpsim.proxy.http")

# Envoy's connection idle timeout (common_http_protocol_options.idle_timeout, 1 h by default): a
# connection with no stream open for this long is closed, and so is a CONNECT tunnel with no bytes
# either way.
CONNECTION_IDLE_TIMEOUT = 3600.0
IDLE_ENV = "NCPSIM_PROXY_CONNECTION_IDLE"  # tests only: shortens CONNECTION_IDLE_TIMEOUT


REQUEST_START = bytes(range(ord("A"), ord("Z") + 1))  # a plain request's method is upper case


def connection_idle_timeout() -> float:
    return float(os.environ.get(IDLE_ENV) or CONNECTION_IDLE_TIMEOUT)


Next = h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]  # what h11's next_event() returns


class ConnectionIdle(Exception):
    """No request started within the connection idle timeout: Envoy closes without a reply or a log line."""


class DownstreamClosed(ConnectionError):
    """The worker's side went away in the middle of a request."""


def reason(status: int) -> bytes:
    """The reason phrase Envoy's codec writes for a status code (it never relays the upstream's own)."""
    return reason_phrase(status)


class Downstream(HeadReader):
    """A worker's connection: the bytes read and not yet consumed, and its reads under their timeouts.

    A plain request (sim.protocols.h1plain) is taken from `pending` as it is; for any other, `judge()` hands
    what is pending to an h11 connection for that one request, and `resume()` takes back what h11 read past
    it. Either way every byte is read once and h11 sees exactly the bytes it would have seen alone."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        super().__init__(reader)
        self.writer = writer

    async def request_head(self, stream_idle: float, connection_idle: float) -> int:
        """HeadReader.head with read_head's timeouts: an idle keep-alive connection waits up to the connection
        idle timeout (ConnectionIdle); once a request's first bytes arrived, the stream idle timeout
        (TimeoutError)."""
        try:
            return await self.head(REQUEST_START, connection_idle, stream_idle)
        except TimeoutError:
            if self.pending:
                raise
            raise ConnectionIdle(f"no request for {connection_idle:g} s") from None

    def judge(self) -> H11Stream:
        """An h11 server connection holding everything pending (and the EOF, if it came), for one request."""
        stream = H11Stream(h11.SERVER, self.reader, self.writer, self.reads)
        self.hand_over(stream.conn)
        return stream

    def resume(self, stream: H11Stream) -> None:
        """After a request h11 served: what it read past that request is pending again."""
        left, self.eof = stream.conn.trailing_data
        self.pending[:0] = left

    def answering(self, method: str, keep_alive: bool) -> H11Stream:
        """An h11 server connection that has read a complete `method` request (one asking to close unless
        `keep_alive`), to frame the response to a plain request as h11 would have framed it."""
        stream = H11Stream(h11.SERVER, self.reader, self.writer, self.reads)
        close = b"" if keep_alive else b"connection: close\r\n"
        stream.conn.receive_data(method.encode() + b" / HTTP/1.1\r\nhost: pod\r\n" + close + b"\r\n")
        stream.conn.next_event()  # the request
        stream.conn.next_event()  # its end
        return stream

    def close(self) -> None:
        self.reads.close()
        self.writer.close()


async def read_head(down: H11Stream, stream_idle: float, connection_idle: float) -> tuple[Next, bytes]:
    """The next request head and its raw bytes as sent.

    An idle keep-alive connection waits up to the connection idle timeout (ConnectionIdle); once a
    request's first bytes arrived its stream exists, and a client that goes quiet for the stream idle
    timeout gets TimeoutError (408 SI, as Envoy answers a slow-loris head)."""
    raw = bytearray(down.conn.trailing_data[0])  # a pipelined request already buffered by h11
    while True:
        try:
            event = down.conn.next_event()
        except h11.RemoteProtocolError:
            fixed = with_host_from_url(bytes(raw))
            if fixed is None:  # a head that has its Host (the retry's included): h11's refusal stands
                raise
            # Absolute-form without Host: Envoy forwards it with :authority from the URL. h11 refuses
            # it, so parse the same bytes again, with that Host, on a fresh parser for this cycle.
            down.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
            down.conn.receive_data(fixed)
            raw = bytearray(fixed)
            continue
        if event is not h11.NEED_DATA:
            return event, bytes(raw[: len(raw) - len(down.conn.trailing_data[0])])
        started = bool(down.conn.trailing_data[0])
        try:
            data = await down.reads.read(stream_idle if started else connection_idle)
        except TimeoutError:
            if started:
                raise
            raise ConnectionIdle(f"no request for {connection_idle:g} s") from None
        raw += data
        down.conn.receive_data(data)  # b"" is EOF: ConnectionClosed, or RemoteProtocolError mid-head


def reply_body(reject: Reject) -> bytes:
    """Envoy's local-reply body: none for NR, the status text for codec errors (its HTTP/1 codec sends
    CodeUtility::toString), the reset or failure text otherwise."""
    if reject.flag == "NR":
        return b""
    if reject.close and reject.flag in ("DPE", "-"):
        return reason(reject.status)
    return reject.reason.encode()


async def local_reply(down: H11Stream, status: int, body: bytes, close: bool, head_request: bool) -> int:
    """Envoy's local reply: standard reason phrase, text/plain body (none on HEAD, Content-Length kept), the
    connection manager's Date. Returns the body bytes sent, as %BYTES_SENT% counts them."""
    headers = [("content-length", str(len(body)))]
    if body:
        headers.append(("content-type", "text/plain"))
    headers += [("date", http_date(time.time())), ("server", "envoy")]
    if close:
        headers.append(("connection", "close"))
    sent = b"" if head_request else body
    events: list[h11.Event] = [h11.Response(status_code=status, headers=headers, reason=reason(status))]
    await down.send(*events, *([h11.Data(data=sent)] if sent else []), h11.EndOfMessage())
    return len(sent)


async def send_continue(down: H11Stream) -> None:
    """100 Continue, as Envoy sends it itself for `Expect: 100-continue` (the header is not forwarded)."""
    if down.conn.they_are_waiting_for_100_continue:
        await down.send(h11.InformationalResponse(status_code=100, headers=[], reason=reason(100)))


def end_reason(exc: BaseException | None) -> str:
    """Why a worker's connection ended, in ncpsim's words (the library's own detail goes to debug)."""
    if exc is None:
        return "closed"
    log.debug("connection ended by %s: %s", type(exc).__name__, exc)
    if isinstance(exc, ConnectionIdle):
        return f"idle timeout ({exc})"
    if isinstance(exc, DownstreamClosed):
        return "worker connection closed mid-request"
    if isinstance(exc, h11.RemoteProtocolError):
        return "malformed request from the worker"
    if isinstance(exc, h11.LocalProtocolError):
        return "proxy could not frame its reply"
    if isinstance(exc, TimeoutError):
        return "stream idle timeout"
    if isinstance(exc, ssl.SSLError):
        return "TLS error on the worker connection"
    if isinstance(exc, (ConnectionError, asyncio.IncompleteReadError)):
        return "worker connection reset"
    return f"unexpected {type(exc).__name__}"
