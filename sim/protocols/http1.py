"""Thin asyncio glue around h11: every HTTP/1.1 party in ncpsim (pods, proxy, worker, client) uses it.

The common message skips h11: a client's `exchange` reads a plain response (sim.protocols.h1plain) itself, and
a server reads a plain request (H11Stream.plain_request) and writes a plain answer (`respond`) itself, each
giving exactly what h11 gives (tests/test_plain_exchange.py); whatever is not plain is handed to h11 with the
bytes read so far, and h11 judges it as it always has."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from http import HTTPStatus
from typing import cast

import h11

from sim.protocols.dial import close_within
from sim.protocols.h1plain import (
    NOT_BY_LENGTH,
    PlainRequest,
    plain_fields,
    plain_request,
    plain_request_out,
    plain_response,
    request_bytes,
    response_bytes,
)
from sim.protocols.reads import MAX_HEAD, HeadReader, TimedReads


class PeerClosed(ConnectionError):
    """The other side closed the connection before a complete message."""


class ClosedBeforeResponse(PeerClosed):
    """The server hung up before any byte of its response (Go's Transport retries an idempotent request then,
    when the connection was a kept-alive one)."""

    def __init__(self) -> None:
        super().__init__("connection closed before a response")


CHUNK_SIZE_MAX = 2**64 - 1  # Envoy's codecs hold a chunk's size in 64 bits; h11 reads up to 20 hex digits


def _chunk_size_in_range(conn: h11.Connection, event: object) -> None:
    """Refuse a chunk whose size does not fit in 64 bits, as Envoy does (400), instead of waiting for it.

    h11 keeps the size of the chunk being read, less what it has handed out, in its reader: right after the
    chunk's header that is the size itself (plus the Data it returned with the header). A private field,
    read only here; should h11 rename it the check reads 0 and tests/test_hostile_http.py's f-chunk-2e64
    case fails."""
    left = getattr(getattr(conn, "_reader", None), "_bytes_in_chunk", 0)
    if isinstance(event, h11.Data) and event.chunk_start:
        left += len(event.data)
    if left > CHUNK_SIZE_MAX:
        raise h11.RemoteProtocolError("chunk size overflows 64 bits", 400)


RESPONSE_STARTS = b"H"  # "HTTP/1.1 ..."
REQUEST_STARTS = bytes(range(ord("A"), ord("Z") + 1))  # a plain request's method: upper-case letters


class H11Stream:
    def __init__(
        self,
        role: type[h11.CLIENT | h11.SERVER],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        reads: TimedReads | None = None,
        max_head: int = MAX_HEAD,
    ):
        self.conn = h11.Connection(role, max_incomplete_event_size=max_head)
        self.reader, self.writer = reader, writer
        self.reads = reads or TimedReads(reader)  # `reads`: the connection's, when h11 takes it over
        self.max_head = max_head
        self._plain_cycle_over = False  # a plain message ended the last cycle (plain_response, answer_plain)
        self._plain_request: bytes | None = None  # the plain request being answered, as it came
        # a request written without h11, whose response is due: (method, target, fields, body)
        self._plain_sent: tuple[str, str, list[tuple[str, str]], bytes] | None = None

    async def next_event(self, timeout: float | None = None) -> h11.Event:
        """The next event (h11.PAUSED, a sentinel class, when the peer's next message waits for ours: callers
        compare it by identity, as h11's own docs do)."""
        while True:
            event = self.buffered_event()
            if event is not h11.NEED_DATA:
                return cast(h11.Event, event)  # mypy cannot narrow a sentinel class away by identity
            data = await self.reads.read(timeout)
            # b"" is EOF: h11 then answers ConnectionClosed, or RemoteProtocolError mid-message.
            self.conn.receive_data(data)

    def buffered_event(self) -> h11.Event | type[h11.NEED_DATA | h11.PAUSED]:
        """The next event from what h11 holds already: h11's next_event(), with a chunk size that overflows
        64 bits refused as Envoy refuses it."""
        if self._plain_sent is not None:
            self._h11_sends_the_request()  # its response is h11's to read: h11 learns what was asked
        event = self.conn.next_event()
        _chunk_size_in_range(self.conn, event)
        return event

    async def send(self, *events: h11.Event) -> None:
        if self._plain_request is not None:
            self._h11_takes_the_request()  # an answer only h11 writes: h11 reads the request first
        if self._plain_sent is not None:
            self._h11_sends_the_request()  # a request while one is unanswered: h11 refuses it, as before
        # One write for all the events: over TLS each write is its own record and its own send().
        payload = b"".join(self.conn.send(event) or b"" for event in events)
        if payload:
            self.writer.write(payload)
        await self.writer.drain()

    async def send_plain_request(
        self, method: str, target: str, fields: list[tuple[str, str]], body: bytes
    ) -> bool:
        """Write a request without h11 (client role, at the start of a cycle) when it is plain
        (h1plain.plain_request_out), in the bytes h11 would write; False, and nothing written, when h11
        must write it. h11 is told of the request only if it comes to read the response."""
        if (self.conn.our_state, self.conn.their_state) != (h11.IDLE, h11.IDLE) or self._plain_sent:
            return False
        if not plain_request_out(method, target, fields, len(body)):
            return False
        self._plain_sent = (method, target, fields, body)
        self.writer.write(request_bytes(method, target, fields) + body)
        await self.writer.drain()
        return True

    def _h11_sends_the_request(self) -> None:
        """h11 sends the request written without it (its bytes dropped: they are on the wire already)."""
        assert self._plain_sent is not None
        method, target, fields, body = self._plain_sent
        self._plain_sent = None
        self.conn.send(h11.Request(method=method, target=target, headers=fields))
        if body:
            self.conn.send(h11.Data(data=body))
        self.conn.send(h11.EndOfMessage())

    async def plain_response(self, method: str, timeout: float | None) -> Response | None:
        """The response to the request just sent (client role), read without h11 when it is plain
        (sim.protocols.h1plain), keeps the connection and arrives whole with nothing past it; else None, with
        every byte read so far handed to h11, which reads on from there as if it had read them itself. Reads
        wait up to `timeout` each, as next_event's; one that fails (past it, reset, cancelled) raises as
        next_event's would, and the bytes read go with the exchange, whose connection every caller closes then.
        After a plain response the stream is ready for the next request, on a new h11 connection in the state
        start_next_cycle would have left the old one in."""
        conn = self.conn
        sent_by_h11 = self._plain_sent is None
        if sent_by_h11 and (
            method in NOT_BY_LENGTH or (conn.our_state, conn.their_state) != (h11.DONE, h11.SEND_RESPONSE)
        ):
            return None  # a HEAD's or CONNECT's response, or a request that asked to close: h11's
        if (read := await self._head(RESPONSE_STARTS, timeout)) is None:
            return None
        got, end = read
        plain = plain_response(bytes(got.pending[:end]))
        # to h11, as it would have read them, unless plain, kept alive, whole and alone (bytes past it: h11's)
        if (
            plain is None
            or not plain.keep_alive
            or not await got.read_to(whole := end + plain.length, timeout)
            or len(got.pending) > whole
        ):
            got.hand_over(self.conn)
            return None
        if sent_by_h11:
            self.conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=self.max_head)
        self._plain_sent, self._plain_cycle_over = None, True  # (a connection h11 never used is new)
        return Response(plain.status, list(plain.headers), bytes(got.pending[end:]))

    async def plain_request(self) -> tuple[PlainRequest, bytes] | None:
        """The next request and its body (server role), read without h11 when it is plain (sim.protocols.
        h1plain), keeps the connection and comes whole in the reads that complete its head, with nothing past
        it; else None, with every byte read handed to h11, which reads on from there (its events then come as
        they always came: the head first, the body as it arrives). Answer it with answer_plain; any other
        answer is written by h11, which is given the request first (send)."""
        conn = self.conn
        if (conn.our_state, conn.their_state) != (h11.IDLE, h11.IDLE) or self._plain_request is not None:
            return None
        if (read := await self._head(REQUEST_STARTS, None)) is None:
            return None
        got, end = read
        request = plain_request(bytes(got.pending[:end]))
        if request is None or not request.keep_alive or len(got.pending) != end + request.length:
            got.hand_over(self.conn)
            return None
        self._plain_request = bytes(got.pending)
        return request, self._plain_request[end:]

    async def _head(self, starts: bytes, timeout: float | None) -> tuple[HeadReader, int] | None:
        """The bytes read until they hold a whole head (sim.protocols.reads.HeadReader), and where it ends;
        None once they are h11's (see HeadReader.head)."""
        if self.conn.trailing_data != (b"", False):
            return None  # h11 holds bytes already: it reads on
        got = HeadReader(self.reader, self.reads, self.max_head)
        if (end := await got.head(starts, timeout, timeout)) < 0:
            got.hand_over(self.conn)
            return None
        return got, end

    async def answer_plain(self, status: int, fields: list[tuple[str, str]], body: bytes) -> bool:
        """Answer the plain request being answered (plain_request) with `fields`, Content-Length and `body`,
        in the bytes h11 would write; False, and nothing written, when h11 must write it (no plain request
        is being answered, or a field is not plain)."""
        if self._plain_request is None or not plain_fields(fields):
            return False
        self._plain_request, self._plain_cycle_over = None, True
        fields = [*fields, ("content-length", str(len(body)))]
        self.writer.write(response_bytes(status, reason_phrase(status), fields) + body)
        await self.writer.drain()
        return True

    def _h11_takes_the_request(self) -> None:
        """h11 reads the plain request being answered (its head, its body, its end), as if it had all along."""
        raw, self._plain_request = self._plain_request, None
        assert raw is not None
        self.conn.receive_data(raw)
        while isinstance(self.conn.next_event(), (h11.Request, h11.Data)):
            pass

    def reusable(self) -> bool:
        if self._plain_cycle_over:
            return True
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE

    def next_cycle(self) -> None:
        if self._plain_cycle_over:
            self._plain_cycle_over = False  # the new connection is at the start of a cycle already
        else:
            self.conn.start_next_cycle()

    def close(self) -> None:
        self.reads.close()
        self.writer.close()

    async def aclose(self) -> None:
        """close(), waited for: for a client whose loop may end right after (see close_within)."""
        self.reads.close()
        await close_within(self.writer)


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)


def decode_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in headers]


def encode_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """decode_headers undone, for h11 to send: it takes str as ASCII only, and a value may carry obs-text
    (bytes 0x80-0xff), which HTTP/1.1 allows and a relay passes on as it came."""
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def read_body(stream: H11Stream, timeout: float | None = None) -> bytes:
    chunks = []
    while True:
        event = await stream.next_event(timeout)
        if isinstance(event, h11.Data):
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return b"".join(chunks)
        elif isinstance(event, h11.ConnectionClosed):
            raise PeerClosed("connection closed mid-body")


async def exchange(
    stream: H11Stream,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes = b"",
    timeout: float | None = None,
) -> Response:
    """Send one request and read the whole response (client role)."""
    if stream.reusable():
        stream.next_cycle()
    if body or method in ("POST", "PUT"):
        headers = [*headers, ("content-length", str(len(body)))]
    if not await stream.send_plain_request(method, target, headers, body):
        await stream.send(
            h11.Request(method=method, target=target, headers=headers),
            *([h11.Data(data=body)] if body else []),
            h11.EndOfMessage(),
        )
    if (plain := await stream.plain_response(method, timeout)) is not None:
        return plain
    while True:
        try:
            event = await stream.next_event(timeout)
        except h11.RemoteProtocolError as exc:
            if not stream.reader.at_eof() or stream.conn.trailing_data[0]:
                raise
            # h11 calls a hang-up while a response is due a protocol error; here no byte of it had come.
            raise ClosedBeforeResponse from exc
        if isinstance(event, h11.Response):
            break
        if isinstance(event, h11.ConnectionClosed):
            raise ClosedBeforeResponse
    payload = await read_body(stream, timeout)
    return Response(event.status_code, decode_headers(event.headers), payload)


async def respond(
    stream: H11Stream,
    status: int,
    body: bytes = b"",
    headers: list[tuple[str, str]] | None = None,
    close: bool = False,
    head: bool = False,
) -> None:
    """Send one complete response (server role); `head`: the answer to HEAD, Content-Length and no body.
    To a plain request (H11Stream.plain_request), a plain answer is written without h11."""
    sent = b"" if head else body
    if not close and not head and await stream.answer_plain(status, headers or [], sent):
        return
    hdrs = [*(headers or []), ("content-length", str(len(body)))]
    if close:
        hdrs.append(("connection", "close"))
    await stream.send(
        h11.Response(status_code=status, headers=hdrs, reason=reason_phrase(status)),
        *([h11.Data(data=sent)] if sent else []),
        h11.EndOfMessage(),
    )


@lru_cache(maxsize=64)
def reason_phrase(status: int) -> bytes:
    """The standard reason phrase for a status line ("Unknown" for a code without one)."""
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b"Unknown"
