"""Thin asyncio glue around h11: every HTTP/1.1 party in ncpsim (pods, proxy, worker, client) uses it."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from http import HTTPStatus

import h11

READ_SIZE = 65536
# Envoy's default max_request_headers_kb is 60: h11 must be able to buffer that much before we judge.
MAX_HEAD = 64 * 1024


class PeerClosed(ConnectionError):
    """The other side closed the connection before a complete message."""


class ClosedBeforeResponse(PeerClosed):
    """The server hung up before any byte of its response (Go's Transport retries an idempotent request then,
    when the connection was a kept-alive one)."""

    def __init__(self) -> None:
        super().__init__("connection closed before a response")


async def read_within(reader: asyncio.StreamReader, timeout: float | None, size: int = READ_SIZE) -> bytes:
    """One read under a deadline (TimeoutError past it), without the task asyncio.wait_for wraps each read in:
    every HTTP/1.1 party reads this way, and a proxy holds thousands of kept-alive connections waiting."""
    async with asyncio.timeout(timeout):
        return await reader.read(size)


async def open_within(
    host: str,
    port: int,
    timeout: float | None,
    tls: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP (or TLS) connection under a deadline, dialed in the caller's task. asyncio.wait_for dials in a
    task of its own, and on Python 3.11 a caller cancelled just as that task connects gets the connection
    and loses the cancellation (a Ctrl-C or a deadline that never lands); here the cancellation is raised
    at the caller's next suspension, with the connection in hand for its cleanup (tests/test_dial.py)."""
    async with asyncio.timeout(timeout):
        return await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=server_hostname if tls else None
        )


CLOSE_TIMEOUT = 1.0  # for the peer's close_notify; a local peer answers in well under a millisecond


async def close_within(writer: asyncio.StreamWriter, timeout: float = CLOSE_TIMEOUT) -> None:
    """Close, and wait until the socket is closed; abort it past `timeout`. A TLS close sends close_notify
    and keeps the socket until the peer's arrives (asyncio waits up to 30 s for it): a loop that ends
    first, as asyncio.run does once its coroutine returns, leaves the socket open, reported later as an
    unclosed transport in whatever code the garbage collector runs in (tests/test_dial.py)."""
    writer.close()
    try:
        async with asyncio.timeout(timeout):
            await writer.wait_closed()
    except (TimeoutError, OSError):  # no close_notify in time, or the peer reset: the socket goes anyway
        writer.transport.abort()
    except BaseException:  # cancelled while closing: the socket goes, the cancellation goes on
        writer.transport.abort()
        raise


class H11Stream:
    def __init__(
        self, role: type[h11.CLIENT | h11.SERVER], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ):
        self.conn = h11.Connection(role, max_incomplete_event_size=MAX_HEAD)
        self.reader, self.writer = reader, writer

    async def next_event(self, timeout: float | None = None) -> h11.Event:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await read_within(self.reader, timeout)
            # b"" is EOF: h11 then answers ConnectionClosed, or RemoteProtocolError mid-message.
            self.conn.receive_data(data)

    async def send(self, *events: h11.Event) -> None:
        # One write for all the events: over TLS each write is its own record and its own send().
        payload = b"".join(self.conn.send(event) or b"" for event in events)
        if payload:
            self.writer.write(payload)
        await self.writer.drain()

    def reusable(self) -> bool:
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE

    def next_cycle(self) -> None:
        self.conn.start_next_cycle()

    def close(self) -> None:
        self.writer.close()

    async def aclose(self) -> None:
        """close(), waited for: for a client whose loop may end right after (see close_within)."""
        await close_within(self.writer)


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)


def decode_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in headers]


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
    await stream.send(
        h11.Request(method=method, target=target, headers=headers),
        *([h11.Data(data=body)] if body else []),
        h11.EndOfMessage(),
    )
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
    """Send one complete response (server role); `head`: the answer to HEAD, Content-Length and no body."""
    hdrs = list(headers or [])
    hdrs.append(("content-length", str(len(body))))
    if close:
        hdrs.append(("connection", "close"))
    sent = b"" if head else body
    await stream.send(
        h11.Response(status_code=status, headers=hdrs, reason=reason_phrase(status)),
        *([h11.Data(data=sent)] if sent else []),
        h11.EndOfMessage(),
    )


def reason_phrase(status: int) -> bytes:
    """The standard reason phrase for a status line ("Unknown" for a code without one)."""
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b"Unknown"
