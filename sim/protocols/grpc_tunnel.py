"""gRPC inside the callback tunnel: HTTP/2 with prior knowledge (h2c) over an HTTP/3 request stream.

Once grpc-proxy accepts a worker's `POST /v1/proxy`, the stream is a byte pipe in which grpc-proxy is
the HTTP/2 client and the worker the HTTP/2 server (DESIGN.md section 2). H2Tunnel drives the h2
library over any such pipe; the only framing written by hand is gRPC's 5-byte message prefix.
Flow control is end to end: received DATA is acknowledged to h2 only when the application takes it.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, cast

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from sim.protocols.tasks import Tasks

UNARY = "/ncpsim.Echo/Unary"
STREAM = "/ncpsim.Echo/Stream"
MAX_STREAM_COUNT = 10_000

# grpc status codes used here (grpc/doc/statuscodes.md)
OK, INVALID_ARGUMENT, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 0, 3, 12, 13, 14

_PREFIX = struct.Struct(">BI")


class Pipe(Protocol):
    """The tunnel's byte stream (sim.protocols.h3.H3Stream fits)."""

    async def read(self) -> bytes: ...
    def write(self, data: bytes, end: bool = False) -> None: ...
    async def drain(self) -> None: ...
    def end(self) -> None: ...


class GrpcError(Exception):
    def __init__(self, status: int, details: str):
        super().__init__(f"grpc status {status}: {details}")
        self.status, self.details = status, details


# -- gRPC messages (pure) ------------------------------------------------------------------------
def frame_message(payload: bytes) -> bytes:
    return _PREFIX.pack(0, len(payload)) + payload


class Deframer:
    """Length-prefixed gRPC messages out of DATA chunks of any size."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def partial(self) -> bool:
        return bool(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        messages = []
        while len(self._buffer) >= _PREFIX.size:
            compressed, length = _PREFIX.unpack_from(self._buffer)
            if compressed:
                raise GrpcError(INTERNAL, "compressed messages are not supported")
            if len(self._buffer) < _PREFIX.size + length:
                break
            messages.append(bytes(self._buffer[_PREFIX.size : _PREFIX.size + length]))
            del self._buffer[: _PREFIX.size + length]
        return messages


def echo_replies(path: str, request: bytes) -> list[bytes]:
    """The echo service: Unary returns the request; Stream turns {"text", "count"} into count messages."""
    if path == UNARY:
        return [request]
    if path != STREAM:
        raise GrpcError(UNIMPLEMENTED, f"unknown method {path}")
    try:
        ask = json.loads(request)
        text, count = str(ask["text"]), int(ask["count"])
    except (ValueError, KeyError, TypeError) as exc:
        raise GrpcError(
            INVALID_ARGUMENT, f'request must be JSON {{"text": str, "count": int}}: {exc}'
        ) from exc
    if not 0 <= count <= MAX_STREAM_COUNT:
        raise GrpcError(INVALID_ARGUMENT, f"count must be 0..{MAX_STREAM_COUNT}")
    return [json.dumps({"seq": i, "text": text}).encode() for i in range(count)]


# -- HTTP/2 over the pipe ------------------------------------------------------------------------
Handler = Callable[[str, bytes], AsyncIterator[bytes]]


class H2Tunnel:
    """One HTTP/2 connection over a pipe. Client: `call`. Server: `serve(handler)`."""

    def __init__(self, pipe: Pipe, *, client_side: bool):
        self.pipe = pipe
        config = h2.config.H2Configuration(client_side=client_side, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(config)
        self.calls = 0  # requests served (server) or made (client)
        self.closed = False
        self._inbox: dict[int, asyncio.Queue[Any]] = {}
        self._window = asyncio.Event()
        self._handler: Handler | None = None
        self._tasks = Tasks()
        self.conn.initiate_connection()  # the preface goes out with the first flush

    async def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.closed:
            self.pipe.write(data)
            await self.pipe.drain()

    async def run(self) -> None:
        """Read the pipe until the peer ends it; the server side answers requests meanwhile."""
        try:
            await self._flush()
            while data := await self.pipe.read():
                for event in self.conn.receive_data(data):
                    self._dispatch(event)
                await self._flush()
        except h2.exceptions.ProtocolError as exc:
            raise GrpcError(INTERNAL, f"HTTP/2 protocol error in the tunnel: {exc}") from exc
        finally:
            self._shut()
            await self._tasks.cancel_all()

    def _shut(self) -> None:
        self.closed = True
        self._window.set()
        for inbox in self._inbox.values():
            inbox.put_nowait(None)  # wakes every waiting call: the tunnel is gone

    def _dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._window.set()
        elif isinstance(event, h2.events.RequestReceived) and self._handler is not None:
            self._inbox[event.stream_id] = asyncio.Queue()
            self._tasks.spawn(
                self._answer(event.stream_id, _text(event.headers)), f"h2-call-{event.stream_id}"
            )
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._shut()
        inbox = self._inbox.get(getattr(event, "stream_id", -1))
        if inbox is not None and not isinstance(event, h2.events.RequestReceived | h2.events.WindowUpdated):
            inbox.put_nowait(event)

    async def _next(self, stream_id: int) -> Any:
        event = await self._inbox[stream_id].get()
        if event is None:
            raise GrpcError(UNAVAILABLE, "callback tunnel closed")
        if isinstance(event, h2.events.DataReceived):  # taken by the application: open the window again
            self.conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
            await self._flush()
        return event

    async def _send_body(self, stream_id: int, data: bytes, end: bool) -> None:
        view = memoryview(data)
        while view:
            room = min(self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size)
            if self.closed:
                raise GrpcError(UNAVAILABLE, "callback tunnel closed")
            if room <= 0:
                self._window.clear()
                await self._window.wait()
                continue
            self.conn.send_data(stream_id, bytes(view[:room]))
            view = view[room:]
            await self._flush()
        if end:
            self.conn.end_stream(stream_id)
            await self._flush()

    # Client -----------------------------------------------------------------------------------
    async def call(self, path: str, request: bytes, authority: str = "grpc-echo") -> AsyncIterator[bytes]:
        """One gRPC call through the tunnel: yields the response messages, raises GrpcError on failure."""
        stream_id = self.conn.get_next_available_stream_id()
        self._inbox[stream_id] = asyncio.Queue()
        self.calls += 1
        self.conn.send_headers(
            stream_id,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        await self._send_body(stream_id, frame_message(request), end=True)
        deframer, status = Deframer(), None
        while not isinstance(event := await self._next(stream_id), h2.events.StreamEnded):
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                status = _grpc_status(_text(event.headers), status)
            elif isinstance(event, h2.events.DataReceived):
                for message in deframer.feed(event.data):
                    yield message
            elif isinstance(event, h2.events.StreamReset):
                raise GrpcError(UNAVAILABLE, f"worker reset the call (HTTP/2 error {event.error_code})")
        self._inbox.pop(stream_id, None)
        if status is None or status[0] != OK:
            raise GrpcError(*(status or (INTERNAL, "response ended without grpc-status")))

    async def close(self) -> None:
        """Say goodbye (GOAWAY) and end our side of the pipe."""
        if not self.closed:
            self.conn.close_connection()
            await self._flush()
            self.closed = True
            self.pipe.end()

    # Server -----------------------------------------------------------------------------------
    async def serve(self, handler: Handler) -> None:
        self._handler = handler
        await self.run()

    async def _answer(self, stream_id: int, headers: dict[str, str]) -> None:
        path = headers.get(":path", "")
        deframer, messages = Deframer(), []
        while not isinstance(event := await self._next(stream_id), h2.events.StreamEnded):
            if isinstance(event, h2.events.DataReceived):
                messages += deframer.feed(event.data)
        self.calls += 1
        replies = self._handler(path, messages[0] if messages else b"")  # type: ignore[misc]
        started = False
        try:
            async for reply in replies:
                if not started:
                    started = True
                    self.conn.send_headers(
                        stream_id, [(":status", "200"), ("content-type", "application/grpc")]
                    )
                await self._send_body(stream_id, frame_message(reply), end=False)
            trailers = [("grpc-status", str(OK))]
        except GrpcError as exc:
            trailers = [("grpc-status", str(exc.status)), ("grpc-message", exc.details)]
        if not started:  # trailers-only response
            trailers = [(":status", "200"), ("content-type", "application/grpc"), *trailers]
        self.conn.send_headers(stream_id, trailers, end_stream=True)
        self._inbox.pop(stream_id, None)
        await self._flush()


def _text(headers: object) -> dict[str, str]:
    """An event's headers: text, since the connection decodes them (header_encoding="utf-8")."""
    return dict(cast("list[tuple[str, str]]", headers))


def _grpc_status(headers: dict[str, str], current: tuple[int, str] | None) -> tuple[int, str] | None:
    if headers.get(":status", "200") != "200":
        return (UNAVAILABLE, f"worker answered HTTP {headers[':status']}")
    if "grpc-status" in headers:
        return (int(headers["grpc-status"]), headers.get("grpc-message", ""))
    return current
